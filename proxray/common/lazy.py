"""A package's names imported when first asked for (PEP 562): ``import proxray`` or ``import proxray.monitor`` loads
nothing heavy, and a command that needs one part does not import the others."""
from __future__ import annotations

from importlib import import_module


def lazy_exports(package: str, exports: dict):
    """The module ``__getattr__`` of ``package`` for ``exports`` ({name: the module that holds it}): the module is
    imported when one of its names is first asked for; any other name is the usual AttributeError."""
    def __getattr__(name: str):
        if name in exports:
            return getattr(import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
