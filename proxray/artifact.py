"""Router artifacts: a folder of .npy arrays plus a versioned, checksummed ``manifest.json``.

Layout::

    router/
      manifest.json      format, version, class, hyperparameters, models, encoder, file checksums
      <name>.npy         one plain array per piece of learned state (never pickled)

Loading verifies every checksum *before* an array is read, loads with ``allow_pickle=False``, and
checks shapes against the manifest, so a truncated, edited or mismatched artifact fails with an error
that names the file and what was expected. Anything unknown in the manifest is refused.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

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
    inv_tau: float | None  # None encodes inf (JSON has no infinity)
    files: dict[str, FileEntry]
    proxray_version: str


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _json_param(v):
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    if isinstance(v, np.generic):
        return v.item()
    return v


def _registry():
    from .baselines import MLPRouter
    from .routers import KMeansRouter, KNNRouter

    return {c.__name__: c for c in (KNNRouter, KMeansRouter, MLPRouter)}


def save_router(router, path) -> None:
    """Write ``router`` to the folder ``path`` (created; existing artifact files are replaced)."""
    from . import __version__

    router._check_fitted()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, arr in router._state().items():
        arr = np.ascontiguousarray(arr)
        np.save(path / f"{name}.npy", arr, allow_pickle=False)
        files[name] = FileEntry(sha256=_sha256(path / f"{name}.npy"), shape=list(arr.shape), dtype=str(arr.dtype))
    inv_tau = getattr(router, "inv_tau_", None)
    manifest = Manifest(
        format=FORMAT, format_version=FORMAT_VERSION, router_class=type(router).__name__,
        params={k: _json_param(v) for k, v in router.get_params().items()},
        models=list(router.models_), has_cost=bool(router.has_cost_), encoder_id=router.encoder_id_,
        dim=int(router.dim_), n_train=int(router.n_train_),
        inv_tau=None if inv_tau is None or math.isinf(inv_tau) else float(inv_tau),
        files=files, proxray_version=__version__)
    tmp = path / "manifest.json.tmp"
    tmp.write_text(json.dumps(manifest.model_dump(), indent=2))
    os.replace(tmp, path / "manifest.json")  # the manifest lands last and atomically


def read_manifest(path) -> Manifest:
    path = Path(path)
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


def load_router(path, expected_class=None, encoder_id: str | None = None):
    """Load a router artifact; checksums are verified before any array is read.

    ``expected_class``: refuse an artifact of another router class. ``encoder_id``: refuse an artifact
    fitted on embeddings of another encoder.
    """
    path = Path(path)
    manifest = read_manifest(path)
    registry = _registry()
    cls = registry.get(manifest.router_class)
    if cls is None:
        raise ArtifactError(f"{path}: router_class {manifest.router_class!r} is unknown "
                            f"(known: {', '.join(sorted(registry))})")
    if expected_class is not None and not issubclass(cls, expected_class):
        raise ArtifactError(f"{path}: holds a {manifest.router_class}, not a {expected_class.__name__}")
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
        router = cls(**params)
    except TypeError as e:
        raise ArtifactError(f"{path}: hyperparameters do not fit {manifest.router_class}: {e}") from None
    router.models_ = list(manifest.models)
    router.has_cost_ = manifest.has_cost
    router.encoder_id_ = manifest.encoder_id
    router.inv_tau_ = float("inf") if manifest.inv_tau is None else manifest.inv_tau
    router._set_state(arrays, manifest)
    if router.dim_ != manifest.dim or router.n_train_ != manifest.n_train:
        raise ArtifactError(f"{path}: arrays give dim {router.dim_} and {router.n_train_} training queries, "
                            f"manifest says {manifest.dim} and {manifest.n_train}")
    return router
