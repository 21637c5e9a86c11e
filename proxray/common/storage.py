"""Where the evaluation job's output lives: a local folder or any pyarrow filesystem URI
(``file://``, ``s3://``, ``gs://``, ``hdfs://``, …), read and written through one interface.

Every write is atomic for a reader: on a local (or mounted) filesystem the bytes go to a temporary
name beside the target and are renamed into place; on an object store a PUT is all-or-nothing, so
the object is written directly. Nothing here needs the driver's local disk.

S3-compatible endpoints take pyarrow's URI options, e.g.
``s3://bucket/runs/a?endpoint_override=127.0.0.1:9000&scheme=http&region=us-east-1``; credentials come
from the usual places (environment, profile, instance role), never from the URI.
"""
from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

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


class Store:
    """A folder of job output, ``uri`` a local path or a pyarrow filesystem URI."""

    def __init__(self, uri):
        from pyarrow import fs

        uri = str(uri)
        if "://" in uri:
            try:
                self.fs, root = fs.FileSystem.from_uri(uri)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types; name the URI
                raise ValueError(f"output {uri!r}: not a usable filesystem URI ({type(e).__name__}: {e})") from None
        else:
            self.fs, root = fs.LocalFileSystem(), str(Path(uri).resolve())
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
        parent = target.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if not self.local:  # an object store's PUT is atomic: readers see the old object or the new one
            with self.fs.open_output_stream(target) as f:
                f.write(data)
            return target
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
        frames = [self.read_parquet(f) for f in self.files(rel)]
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
