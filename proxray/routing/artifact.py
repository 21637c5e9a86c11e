"""Router artifacts: a folder of .npy arrays plus a versioned, checksummed ``manifest.json``.

Layout::

    router/
      CURRENT                  the name of the version in use, replaced atomically
      v-<time>-<id>/           one folder per save; older ones stay beside it
        manifest.json          format, version, class, hyperparameters, temperature, models, encoder, checksums
        <name>.npy             one plain array per piece of learned state (never pickled)

Saving never touches a version that exists: the new one is written into a temporary folder, renamed
into place whole, and only then does ``CURRENT`` switch to it (temp file + rename). A crash at any point
leaves the previous version loadable. A folder holding ``manifest.json`` itself (the layout before
versions, or a path straight into a version) loads as it is.

Loading verifies every checksum *before* an array is read, loads with ``allow_pickle=False``, and
checks shapes against the manifest, so a truncated, edited or mismatched artifact fails with an error
that names the file and what was expected. Anything unknown in the manifest is refused. Artifacts written
before the temperature was one typed value (``inv_tau`` / ``tau`` / ``temperature`` hyperparameters) load as
what they meant (``temperature.legacy``).

This module knows the format, not the router classes: ``load_router`` is given the classes it may build
(``proxray.routing.registry.load_router`` passes every registered one).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from proxray.common.storage import replace_atomically
from proxray.routing.temperature import Temperature, legacy

FORMAT = "proxray-router"
FORMAT_VERSION = 1


class ArtifactError(ValueError):
    """A router artifact is missing, corrupted, or does not match what the caller expects."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sha256: str
    shape: list[int]
    dtype: str


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["proxray-router"]
    format_version: int
    router_class: str
    params: dict[str, Any]
    models: list[str]
    has_cost: bool
    encoder_id: str | None
    dim: int
    n_train: int
    inv_tau: float | None  # the temperature's number (None encodes inf: JSON has no infinity)
    temperature: str | None = None  # the temperature used, as its spec ("plug-in:0.125"); absent before 0.2
    files: dict[str, FileEntry]
    proxray_version: str


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _json_param(v):
    if isinstance(v, Temperature):
        return v.spec
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, np.generic):
        return v.item()
    return v


POINTER = "CURRENT"
_VERSION_NAME = re.compile(r"v-[0-9]{8}T[0-9]{6}-[0-9a-f]{8}")


def current_version(path) -> Path:
    """The folder holding the manifest and arrays of the artifact at ``path``: the version ``CURRENT``
    names, or ``path`` itself when it holds a manifest (no versions)."""
    path = Path(path)
    pointer = path / POINTER
    if pointer.is_file():
        name = pointer.read_text().strip()
        if not _VERSION_NAME.fullmatch(name):  # never follow a pointer out of the artifact folder
            raise ArtifactError(f"{pointer}: {name!r} is not a version name (v-YYYYMMDDTHHMMSS-xxxxxxxx)")
        if not (path / name).is_dir():
            raise ArtifactError(f"{pointer}: names version {name!r}, which is missing")
        return path / name
    return path


def versions(path) -> list[str]:
    """The version folders of an artifact, oldest first."""
    path = Path(path)
    return sorted(p.name for p in path.iterdir() if p.is_dir() and _VERSION_NAME.fullmatch(p.name)) \
        if path.is_dir() else []


def save_router(router, path) -> Path:
    """Write ``router`` as a new version of the artifact at ``path`` (created) and switch ``CURRENT`` to
    it; versions saved before stay as they are. Returns the new version's folder."""
    router._check_fitted()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    name = f"v-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    tmp = path / f".{name}.tmp"
    tmp.mkdir()
    _write_version(router, tmp)
    os.replace(tmp, path / name)  # the version appears whole or not at all
    replace_atomically(path / POINTER, (name + "\n").encode())  # readers switch only now
    return path / name


def _write_version(router, path: Path) -> None:
    from proxray import __version__

    files = {}
    for name, arr in router._state().items():
        arr = np.ascontiguousarray(arr)
        np.save(path / f"{name}.npy", arr, allow_pickle=False)
        files[name] = FileEntry(sha256=_sha256(path / f"{name}.npy"), shape=list(arr.shape), dtype=str(arr.dtype))
    temperature = getattr(router, "temperature_", None)
    inv_tau = None if temperature is None else temperature.value
    manifest = Manifest(
        format=FORMAT, format_version=FORMAT_VERSION, router_class=type(router).__name__,
        params={k: _json_param(v) for k, v in router.get_params().items()},
        models=list(router.models_), has_cost=bool(router.has_cost_), encoder_id=router.encoder_id_,
        dim=int(router.dim_), n_train=int(router.n_train_),
        inv_tau=None if inv_tau is None or math.isinf(inv_tau) else float(inv_tau),
        temperature=None if temperature is None else temperature.spec, files=files, proxray_version=__version__)
    replace_atomically(path / "manifest.json", json.dumps(manifest.model_dump(), indent=2).encode())


def read_manifest(path) -> Manifest:
    path = current_version(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise ArtifactError(f"{path}: no manifest.json — not a proxray router artifact")
    try:
        raw = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{mpath}: not valid JSON ({e})") from None
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as e:
        raise ArtifactError(f"{mpath}: invalid manifest: {e}") from None
    if manifest.format_version != FORMAT_VERSION:
        raise ArtifactError(f"{mpath}: format_version {manifest.format_version} is not supported "
                            f"(this proxray reads version {FORMAT_VERSION})")
    return manifest


def load_router(path, classes: dict, expected_class=None, encoder_id: str | None = None):
    """Load a router artifact; checksums are verified before any array is read.

    ``classes``: {class name: class} that may be built. ``expected_class``: refuse an artifact of another router
    class. ``encoder_id``: refuse an artifact fitted on embeddings of another encoder.
    """
    path = current_version(path)
    manifest = read_manifest(path)
    if expected_class is not None and manifest.router_class != expected_class.__name__ \
            and not issubclass(classes.get(manifest.router_class, object), expected_class):
        raise ArtifactError(f"{path}: holds a {manifest.router_class}, not a {expected_class.__name__}")
    cls = classes.get(manifest.router_class)
    if cls is None:
        raise ArtifactError(f"{path}: router_class {manifest.router_class!r} is unknown "
                            f"(known: {', '.join(sorted(classes))})")
    if encoder_id is not None and manifest.encoder_id != encoder_id:
        raise ArtifactError(f"{path}: fitted on embeddings of encoder {manifest.encoder_id!r}, "
                            f"not {encoder_id!r}")
    arrays = {}
    for name, entry in manifest.files.items():
        fpath = path / f"{name}.npy"
        if not fpath.is_file():
            raise ArtifactError(f"{fpath}: missing (listed in the manifest)")
        digest = _sha256(fpath)
        if digest != entry.sha256:
            raise ArtifactError(f"{fpath}: checksum mismatch (manifest {entry.sha256[:12]}…, file {digest[:12]}…): "
                                "the artifact is corrupted or was modified")
        arr = np.load(fpath, allow_pickle=False)
        if list(arr.shape) != entry.shape or str(arr.dtype) != entry.dtype:
            raise ArtifactError(f"{fpath}: shape {arr.shape} {arr.dtype}, manifest says {tuple(entry.shape)} {entry.dtype}")
        arrays[name] = arr
    params = {k: (float("inf") if v == "inf" else v) for k, v in manifest.params.items()}
    try:
        params = _current_params(params)
        router = cls(**params)
        if hasattr(router, "_resolve_temperature"):
            router.temperature_ = router._resolve_temperature()
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: hyperparameters do not fit {manifest.router_class}: {e}") from None
    router.models_ = list(manifest.models)
    router.has_cost_ = manifest.has_cost
    router.encoder_id_ = manifest.encoder_id
    router._set_state(arrays, manifest)
    if router.dim_ != manifest.dim or router.n_train_ != manifest.n_train:
        raise ArtifactError(f"{path}: arrays give dim {router.dim_} and {router.n_train_} training queries, "
                            f"manifest says {manifest.dim} and {manifest.n_train}")
    return router


def _current_params(params: dict) -> dict:
    """Hyperparameters as today's routers take them: an artifact saved with ``inv_tau`` / ``tau`` and a
    temperature name gets the one typed temperature those meant (``temperature.legacy``)."""
    if "inv_tau" not in params and "tau" not in params:
        return params
    params = dict(params)
    inv_tau, tau = params.pop("inv_tau", None), params.pop("tau", None)
    spec = legacy(inv_tau, tau, params.get("temperature") or "fixed")
    params["temperature"] = spec if isinstance(spec, str) else spec.spec
    return params
