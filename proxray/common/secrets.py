"""Secrets at the boundary, by one set of rules: where a key is read from (``read_secret``: a file's first line or
an environment variable; a source that is named but missing or empty is an error, never "no key"), what mode a key
file may have (``KEY_FILE_RULE``), and what must never hold one (a ``runtime_env``, stored and shown by Ray)."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.I)
KEY_FILE_RULE = ("readable by its owner only (600 or 400), or read-only for its owner and group with nothing for "
                 "others (440: a Kubernetes Secret mounted with the pod's fsGroup)")


def read_secret(file: str | None, env: str | None) -> str:
    """The key ``file`` (its first line) or ``env`` (an environment variable) holds, stripped; "" when neither is
    named. A named source that cannot be read or is empty is a ``ValueError`` naming the source, never the value."""
    if file:
        try:
            lines = Path(file).expanduser().read_text().splitlines()
        except OSError as e:
            raise ValueError(f"api_key_file={file!r}: cannot read it ({e.strerror})") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"api_key_file={file!r} is empty")
        return key
    if env:
        key = os.environ.get(env, "").strip()
        if not key:
            raise ValueError(f"api_key_env={env!r} is set but the environment variable is empty or unset here")
        return key
    return ""


def key_file_mode_ok(mode: int) -> bool:
    """The key-file rule: no permission for others; the group may read only a file no one can write."""
    return not mode & 0o007 and (not mode & 0o070 or (mode & 0o070 == 0o040 and not mode & 0o200))


def key_file_problems(path: str, what: str) -> list:
    """A key or token file: present, not empty, and its mode within ``KEY_FILE_RULE`` (on this machine)."""
    p = Path(os.path.expanduser(path))
    if not p.is_file():
        return [f"{what}: {path} does not exist on this machine (create it with mode 600; it must be on every node)"]
    mode = stat.S_IMODE(p.stat().st_mode)
    problems = []
    if not key_file_mode_ok(mode):
        problems.append(f"{what}: {path} has mode {mode:o}; a key file must be {KEY_FILE_RULE}: chmod 600 {path}")
    if not p.read_text().strip():
        problems.append(f"{what}: {path} is empty")
    return problems


def secret_problems(models, where: str) -> list:
    """A secret written into a model's runtime_env (it would be stored with the job or the app, and logged); an
    endpoint's key file that is missing, empty or readable by others."""
    out = []
    for i, m in enumerate(models):
        if getattr(m, "api_key_file", None):
            out += key_file_problems(m.api_key_file, f"{where}.{i}.api_key_file")
        env = ((m.runtime_env or {}).get("env_vars") or {}) if hasattr(m, "runtime_env") else {}
        for name, value in env.items():
            if SECRET_NAME.search(name) and value:
                out.append(f"{where}.{i}.runtime_env.env_vars.{name}: a secret in a runtime_env is stored with the "
                           "config and shown by Ray; give it to the nodes as a file (a file_mount, mode 600)")
    return out


_PATH = re.compile(r"(?<![\w.])/(?:[\w.\-]+/)+[\w.\-]*")


def scrub(text: str, limit: int = 300, key: str | None = None, local: bool = False) -> str:
    """A message fit for a client, a table or a log, the one scrubber of every failure the gateway or the job passes
    on: without ``key`` (``<key>``), on one line, at most ``limit`` characters. ``local``: the text is one of this
    machine's own exceptions — its first line only, filesystem paths as ``<path>`` (an upstream's message is kept whole,
    its URLs with it)."""
    text = text or ""
    if key:
        text = text.replace(key, "<key>")
    if local:
        text = text.strip().splitlines()[0] if text.strip() else ""
        return _PATH.sub("<path>", text)[:limit]
    return " ".join(text.split())[:limit]
