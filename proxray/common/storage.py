"""Where the evaluation job's output lives: a local folder or any pyarrow filesystem URI
(``file://``, ``s3://``, ``gs://``, ``hdfs://``, …), read and written through one interface.

Every write is atomic for a reader: on a local (or mounted) filesystem the bytes go to a temporary
name beside the target and are renamed into place; on an object store a PUT is all-or-nothing, so
the object is written directly. Nothing here needs the driver's local disk.

S3-compatible endpoints take pyarrow's URI options, e.g.
``s3://bucket/runs/a?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``, or the standard
``AWS_ENDPOINT_URL`` (``AWS_ENDPOINT_URL_S3``) variable for every ``s3://`` URI that names no endpoint;
credentials come from the usual places (environment, profile, instance role), never from the URI.
``check_location`` tells a bad URI, missing credentials, a missing bucket and an unreachable store apart,
before any work starts.
"""
from __future__ import annotations

import io
import os
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

if TYPE_CHECKING:  # pandas is imported where a table is read: a key file or a router's JSON needs none of it
    import pandas as pd


def replace_atomically(path, data: bytes) -> None:
    """Write ``data`` to the local file ``path`` so that a reader sees the old file or the new one, never
    half of one: a temporary file beside it, flushed to disk, renamed over it (removed if writing fails;
    a killed process can leave a hidden .tmp-* file, which no reader lists)."""
    head, name = os.path.split(str(path))
    tmp = os.path.join(head, f".{name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def is_uri(location) -> bool:
    """Whether ``location`` is a filesystem URI (``s3://…``, ``gs://…``, ``file://…``) rather than a local path."""
    return "://" in str(location)


def filesystem(location):
    """(pyarrow filesystem, path in it) for a local path or a filesystem URI. An ``s3://`` URI without
    ``endpoint_override`` goes to ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` where one is set (an S3-compatible
    store: MinIO, Ceph, a local test server). A URI pyarrow cannot use is a ValueError naming it."""
    from pyarrow import fs

    uri = str(location)
    if not is_uri(uri):
        return fs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if uri.startswith("s3://") and endpoint and "endpoint_override=" not in uri:
        e = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        uri += ("&" if "?" in uri else "?") + f"endpoint_override={e.netloc}&scheme={e.scheme}"
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region and "region=" not in uri:
            uri += f"&region={region}"
    try:
        return fs.FileSystem.from_uri(uri)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types; name the URI
        raise ValueError(f"{location!r}: not a usable filesystem URI ({type(e).__name__}: {str(e)[:300]})") from None


def join(location, rel: str) -> str:
    """``location``/``rel`` for a local path or a URI (a URI's query, ``?endpoint_override=…``, stays at the end)."""
    from urllib.parse import urlsplit, urlunsplit

    if not is_uri(location):
        return str(Path(location) / rel)
    parts = urlsplit(str(location))
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/" + rel))


def split_location(location) -> tuple[str, str]:
    """(its folder, its name) for a file's local path or URI; a URI's query (``?endpoint_override=…``) stays with
    the folder."""
    from urllib.parse import urlsplit, urlunsplit

    if not is_uri(location):
        path = Path(location)
        return str(path.parent), path.name
    parts = urlsplit(str(location))
    folder, _, name = parts.path.rpartition("/")
    return urlunsplit(parts._replace(path=folder or "/")), name


def read_file(location) -> bytes:
    """The bytes of one file, local or at a URI (FileNotFoundError naming it when there is none)."""
    if not is_uri(location):
        return Path(location).read_bytes()
    folder, name = split_location(location)
    store = Store(folder)
    if not store.exists(name):
        raise FileNotFoundError(f"{location}: no such file")
    return store.read_bytes(name)


def write_file(location, data: bytes) -> str:
    """Write one file, local or at a URI, atomically (``Store.write_bytes``); returns ``location``."""
    folder, name = split_location(location)
    Store(folder).write_bytes(name, data)
    return str(location)


_TROUBLE = [  # what an object store's error says, and what it means for the user
    (r"ACCESS_DENIED|AccessDenied|INVALID_ACCESS_KEY|InvalidAccessKeyId|SignatureDoesNotMatch|credentials|"
     r"HTTP status 403|ExpiredToken",
     "access denied: no valid credentials for it (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the "
     "node's instance role)"),
    (r"NoSuchBucket|NO_SUCH_BUCKET|bucket does not exist|Bucket .* does not exist|HTTP status 404",
     "the bucket does not exist"),
    (r"NETWORK_CONNECTION|curlCode|Couldn't connect|Could not connect|Connection refused|Timeout|timed out|"
     r"resolve host|Failed to connect",
     "unreachable: no answer from the store (its endpoint, the network, a firewall)"),
]


def storage_trouble(e: BaseException) -> str:
    """An object store's error in one phrase a user can act on (the store's own words after it)."""
    text = str(e)
    for pattern, meaning in _TROUBLE:
        if re.search(pattern, text):
            return f"{meaning} [{text.strip().splitlines()[0][:200]}]"
    return text.strip().splitlines()[0][:300] if text.strip() else type(e).__name__


def check_location(location, what: str, write: bool = False, file: bool = False) -> None:
    """Fail before any work when ``location`` cannot be used, with one error naming ``what``, the location and
    the reason: a URI pyarrow cannot use, a missing bucket, no credentials, an unreachable store, a missing file
    (``file=True``: it must exist), or (``write=True``) a place that does not take a write (a probe object is
    written and removed)."""
    from pyarrow import fs as pafs

    try:
        filesys, path = filesystem(location)
    except ValueError as e:
        raise ValueError(f"{what}: {e}") from None
    try:
        info = filesys.get_file_info(path)
        if file and info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{what} {location}: no such file")
        if write and not isinstance(filesys, pafs.LocalFileSystem):
            probe = f"{path.rstrip('/')}/.proxray-probe-{uuid.uuid4().hex[:8]}"
            with filesys.open_output_stream(probe) as f:
                f.write(b"")
            filesys.delete_file(probe)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise ValueError(f"{what} {location}: {storage_trouble(e)}") from None


class Store:
    """A folder of job output, ``uri`` a local path or a pyarrow filesystem URI."""

    def __init__(self, uri):
        from pyarrow import fs

        uri = str(uri)
        try:
            self.fs, root = filesystem(uri)
        except ValueError as e:
            raise ValueError(f"output {e}") from None
        self.uri = uri
        self.root = root.rstrip("/")
        self.local = isinstance(self.fs, fs.LocalFileSystem)

    def __repr__(self):
        return f"Store({self.uri!r})"

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    # ---- writing -----------------------------------------------------------------------------
    def write_bytes(self, rel: str, data: bytes) -> str:
        target = self.path(rel)
        if not self.local:  # an object store's PUT is atomic: readers see the old object or the new one; it has
            with self.fs.open_output_stream(target) as f:  # no folders to make (no empty marker objects)
                f.write(data)
            return target
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        replace_atomically(target, data)
        return target

    def write_parquet(self, df: pd.DataFrame, rel: str) -> str:
        buf = io.BytesIO()
        df.to_parquet(buf, index=False)
        return self.write_bytes(rel, buf.getvalue())

    def write_text(self, rel: str, text: str) -> str:
        return self.write_bytes(rel, text.encode())

    def delete(self, rel: str) -> None:
        if self.exists(rel):
            self.fs.delete_file(self.path(rel))

    # ---- reading -----------------------------------------------------------------------------
    def exists(self, rel: str) -> bool:
        from pyarrow import fs

        return self.fs.get_file_info(self.path(rel)).type != fs.FileType.NotFound

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_file(self.path(rel)) as f:
            return f.read()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode()

    def files(self, rel: str, suffix: str = ".parquet") -> list[str]:
        """Paths (relative to the store) of the files ending in ``suffix`` below folder ``rel``, sorted;
        temporary files of interrupted writes are not listed."""
        from pyarrow import fs

        info = self.fs.get_file_info(self.path(rel))
        if info.type != fs.FileType.Directory:
            return []
        found = self.fs.get_file_info(fs.FileSelector(self.path(rel), recursive=True))
        n = len(self.root) + 1
        return sorted(f.path[n:] for f in found if f.type == fs.FileType.File and f.path.endswith(suffix))

    def read_parquet(self, rel: str) -> pd.DataFrame:
        import pyarrow.parquet as pq

        return pq.read_table(self.path(rel), filesystem=self.fs).to_pandas()

    def read_parts(self, rel: str) -> pd.DataFrame:
        """Every parquet file below folder ``rel``, concatenated (an empty frame when there is none)."""
        import pandas as pd

        frames = [self.read_parquet(f) for f in self.files(rel)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
