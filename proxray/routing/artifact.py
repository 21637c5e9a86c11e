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

On an object store (any ``proxray.common.storage`` URI: ``s3://bucket/routers/r``) a version's arrays are
PUT first, its manifest after them, ``CURRENT`` last: a reader that follows ``CURRENT`` finds a complete
version, and no rename is needed. Loading from a URI downloads each array once into the local cache,
named by its checksum (``<cache>/artifacts/<sha256>.npy``), so every replica on a node shares one copy
and a new version downloads only what changed.

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
from pydantic import ValidationError

from proxray.common.storage import Store, is_uri, join, replace_atomically, storage_trouble
from proxray.common.yamlconfig import StrictModel
from proxray.routing.temperature import Temperature, legacy, parse_temperature

FORMAT = "proxray-router"
FORMAT_VERSION = 1


class ArtifactError(ValueError):
    """A router artifact is missing, corrupted, or does not match what the caller expects."""


class FileEntry(StrictModel):
    sha256: str
    shape: list[int]
    dtype: str


class Manifest(StrictModel):
    format: Literal["proxray-router"]
    format_version: int
    router_class: str
    params: dict[str, Any]
    models: list[str]
    has_cost: bool
    encoder_id: str | None
    dim: int
    n_train: int
    temperature: str | None = None  # the temperature the weights use, as its spec ("plug-in:0.125"); absent before 0.2
    inv_tau: float | None = None  # its number, as earlier artifacts also wrote it: read, never written
    index: dict[str, Any] | None = None  # kNN: the search index's kind, parameters and measured recall (0.2.x on)
    encoder_choice: dict[str, Any] | None = None  # fit --encoder auto: both encoders' scores and the choice
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


def current_version(path):
    """The folder holding the manifest and arrays of the artifact at ``path``: the version ``CURRENT``
    names, or ``path`` itself when it holds a manifest (no versions). A URI gives a URI."""
    if is_uri(path):
        return _Remote(path).version_location
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
    if is_uri(path):
        from pyarrow import fs

        store = Store(path)
        found = store.fs.get_file_info(fs.FileSelector(store.root, allow_not_found=True))
        return sorted(f.base_name for f in found
                      if f.type == fs.FileType.Directory and _VERSION_NAME.fullmatch(f.base_name))
    path = Path(path)
    return sorted(p.name for p in path.iterdir() if p.is_dir() and _VERSION_NAME.fullmatch(p.name)) \
        if path.is_dir() else []


def save_router(router, path):
    """Write ``router`` as a new version of the artifact at ``path`` (a local folder, created, or a URI) and switch
    ``CURRENT`` to it; versions saved before stay as they are. Returns the new version's folder (or URI)."""
    router._check_fitted()
    name = f"v-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
    if is_uri(path):
        return _save_remote(router, path, name)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tmp = path / f".{name}.tmp"
    tmp.mkdir()
    _write_version(router, tmp)
    os.replace(tmp, path / name)  # the version appears whole or not at all
    replace_atomically(path / POINTER, (name + "\n").encode())  # readers switch only now
    return path / name


def _write_version(router, path: Path) -> None:
    from proxray import __version__

    files = {}
    for name, arr in {**router._state(), **router._provenance()}.items():
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:  # np.ascontiguousarray would also turn a 0-d scalar into shape (1,)
            arr = arr.copy(order="C")
        np.save(path / f"{name}.npy", arr, allow_pickle=False)
        files[name] = FileEntry(sha256=_sha256(path / f"{name}.npy"), shape=list(arr.shape), dtype=str(arr.dtype))
    temperature = getattr(router, "temperature_", None)
    manifest = Manifest(
        format=FORMAT, format_version=FORMAT_VERSION, router_class=type(router).__name__,
        params={k: _json_param(v) for k, v in router.get_params().items()},
        models=list(router.models_), has_cost=bool(router.has_cost_), encoder_id=router.encoder_id_,
        dim=int(router.dim_), n_train=int(router.n_train_),
        temperature=None if temperature is None else temperature.spec, index=getattr(router, "index_info_", None),
        encoder_choice=getattr(router, "encoder_choice_", None), files=files, proxray_version=__version__)
    absent = {name for name in ("index", "encoder_choice") if getattr(manifest, name) is None}
    replace_atomically(path / "manifest.json", json.dumps(manifest.model_dump(exclude={"inv_tau"} | absent),
                                                          indent=2).encode())


def _save_remote(router, uri, name: str) -> str:
    """The arrays, then the manifest, then ``CURRENT``: each one PUT (atomic on an object store), in that order."""
    import tempfile

    store = Store(uri)
    with tempfile.TemporaryDirectory() as tmp:
        _write_version(router, Path(tmp))
        for f in sorted(Path(tmp).glob("*.npy")):
            store.write_bytes(f"{name}/{f.name}", f.read_bytes())
        store.write_bytes(f"{name}/manifest.json", (Path(tmp) / "manifest.json").read_bytes())
    store.write_bytes(POINTER, (name + "\n").encode())  # readers switch only now
    return join(uri, name)


class _Remote:
    """An artifact at a URI: its version's manifest and arrays, each array downloaded once into the local cache
    under its checksum."""

    def __init__(self, uri):
        self.store, self.uri, self.base = Store(uri), str(uri), ""
        try:
            has_pointer = self.store.exists(POINTER)
        except OSError as e:
            raise ArtifactError(f"{uri}: {storage_trouble(e)}") from None
        if has_pointer:
            name = self.store.read_text(POINTER).strip()
            if not _VERSION_NAME.fullmatch(name):
                raise ArtifactError(f"{join(uri, POINTER)}: {name!r} is not a version name (v-YYYYMMDDTHHMMSS-xxxxxxxx)")
            if not self.store.exists(f"{name}/manifest.json"):
                raise ArtifactError(f"{join(uri, POINTER)}: names version {name!r}, which is missing")
            self.base = f"{name}/"
        self.version_location = join(uri, self.base.rstrip("/")) if self.base else self.uri

    def manifest_text(self) -> str:
        if not self.store.exists(self.base + "manifest.json"):
            raise ArtifactError(f"{self.version_location}: no manifest.json — not a proxray router artifact")
        return self.store.read_text(self.base + "manifest.json")

    def array_file(self, name: str, entry) -> Path:
        """The local, verified copy of array ``name``: from the cache, or downloaded and checked first."""
        from proxray.embeddings.cache import default_cache_dir

        cached = default_cache_dir() / "artifacts" / f"{entry.sha256}.npy"
        if cached.is_file():
            return cached
        rel = f"{self.base}{name}.npy"
        if not self.store.exists(rel):
            raise ArtifactError(f"{join(self.version_location, name + '.npy')}: missing (listed in the manifest)")
        data = self.store.read_bytes(rel)
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry.sha256:
            raise ArtifactError(f"{join(self.version_location, name + '.npy')}: checksum mismatch (manifest "
                                f"{entry.sha256[:12]}…, file {digest[:12]}…): the artifact is corrupted or was modified")
        cached.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(cached, data)
        return cached


def read_manifest(path) -> Manifest:
    if is_uri(path):
        remote = _Remote(path)
        return _parse_manifest(remote.manifest_text(), join(remote.version_location, "manifest.json"))
    path = current_version(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise ArtifactError(f"{path}: no manifest.json — not a proxray router artifact")
    try:
        text = mpath.read_text()
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{mpath}: not valid JSON ({e})") from None
    return _parse_manifest(text, mpath)


def _parse_manifest(text: str, mpath) -> Manifest:
    try:
        raw = json.loads(text)
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
    remote = _Remote(path) if is_uri(path) else None
    path = remote.version_location if remote else current_version(path)
    manifest = _parse_manifest(remote.manifest_text(), join(path, "manifest.json")) if remote else read_manifest(path)
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
        if remote:
            fpath = remote.array_file(name, entry)  # verified when downloaded
        else:
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
        if hasattr(router, "_effective_temperature"):
            router.temperature_ = router._effective_temperature()
            if manifest.temperature and router.weighting == "prox":  # what "auto" meant when it was saved
                router.temperature_ = parse_temperature(manifest.temperature, type(router))
    except (TypeError, ValueError) as e:
        raise ArtifactError(f"{path}: hyperparameters do not fit {manifest.router_class}: {e}") from None
    router.models_ = list(manifest.models)
    router.has_cost_ = manifest.has_cost
    router.encoder_id_ = manifest.encoder_id
    router._set_state(arrays, manifest)
    router._set_provenance(arrays)  # training query ids and tasks, the outlier threshold (absent in older artifacts)
    if manifest.encoder_choice is not None:
        router.encoder_choice_ = dict(manifest.encoder_choice)
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
