"""One command-line grammar for every ``proxray`` command: what a command reads is ``--table`` or ``--config``,
what it writes is ``--out``. Older spellings (``--output``, a positional table, config or path) still parse,
say on stderr what replaces them, and mean the same."""
from __future__ import annotations

import argparse
import sys


class _Renamed(argparse.Action):
    def __init__(self, option_strings, dest, new: str = "", **kw):
        self.new = new
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def comma_list(item=str):
    """An option's type for comma-separated values ("a,b,c" -> [item(a), item(b), item(c)], blanks dropped): the one
    place the command line splits a list; a value ``item`` refuses is argparse's error naming it."""
    def parse(text: str) -> list:
        try:
            out = [item(x.strip()) for x in str(text).split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated {getattr(item, '__name__', 'values')}"
                                             " values") from None
        if not out:
            raise argparse.ArgumentTypeError(f"{text!r}: expected at least one value")
        return out

    parse.__name__ = "comma-separated list"
    return parse


def renamed_flag(parser, old: str, new: str) -> None:
    """``old`` parses as ``new`` (hidden from --help, with a deprecation message)."""
    dest = new.lstrip("-").replace("-", "_")
    parser.add_argument(old, dest=dest, action=_Renamed, new=new)


def flag_with_old_positional(parser, flag: str, required: bool = True, **kw) -> None:
    """``flag`` (e.g. ``--table``), also accepted as the command's first positional argument, the old spelling."""
    dest = flag.lstrip("-").replace("-", "_")
    parser.add_argument(flag, dest=dest, default=None, **kw)
    parser.add_argument(f"old_{dest}", nargs="?", default=None, help=argparse.SUPPRESS, metavar=dest.upper())
    moved = parser.get_default("moved_positionals") or []
    parser.set_defaults(moved_positionals=[*moved, (dest, flag, required, parser)])


def settle(args) -> None:
    """Move old positionals onto their flags (saying so) and enforce the flags that are required."""
    for dest, flag, required, parser in getattr(args, "moved_positionals", None) or []:
        old = getattr(args, f"old_{dest}")
        if old is not None:
            if getattr(args, dest) not in (None, old):
                parser.error(f"{flag} {getattr(args, dest)} and a positional {old}: give one ({flag})")
            print(f"{parser.prog}: a positional {dest} is deprecated; use {flag} {old}", file=sys.stderr)
            setattr(args, dest, old)
        if required and getattr(args, dest) is None:
            parser.error(f"the following arguments are required: {flag}")
