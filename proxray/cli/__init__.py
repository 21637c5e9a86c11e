"""``proxray`` command line: evaluate a pool, fit and measure routers, serve the routed endpoint, run its monitor.
One module per family of commands (``tables``, ``routers``, ``serving``), each registering its commands' options;
the parser assembled here."""
from __future__ import annotations

import argparse
import sys

OVERVIEW = """\
proxray evaluates a pool of LLMs, learns where each one is good and cheap, and serves one OpenAI-compatible
endpoint that routes every query to the right model.

  evaluate a pool     proxray build-table --config JOB.yaml [--out DIR|s3://…] [--sample N] [--simulate]
                      (on a cluster: ray job submit … -- python jobs/build_table.py --config JOB.yaml)
  look at a table     proxray info --table TABLE
  import public data  proxray import routerbench|routerdc|hf FILES --out TABLE
  fit a router        proxray fit --table TABLE --out ROUTER [--router km|knn] [--encoder static]
  measure routers     proxray eval [--table TABLE --outliers TASKS] [--router km|knn]
  explain a decision  proxray explain "TEXT" --router ROUTER [--lam λ] [--json]
  check a config      proxray check --config SERVE|JOB|MONITOR.yaml [--address auto] [--simulate]
  serve the endpoint  proxray serve --config SERVE.yaml [--simulate]
  API keys, policies  proxray keys new --file KEYS.yaml --name N [--lam λ] [--models …] [--rpm R] [--budget-usd U] [--feedback train|record|off]
  watch for drift     proxray monitor start|status|metrics|stop [--config MONITOR.yaml]
  demos and tools     proxray demo serve · proxray demo drift · proxray make-tiny-model --out DIR · proxray gcs-clean"""
EPILOG = """\
What a command reads is --table or --config, what it writes is --out; a table, router or output can be a
local path or a URI (s3://, gs://, file://). `proxray COMMAND --help` lists a command's options."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser; given the ``command`` about to run, the options of ``fit`` and ``eval`` are
    built only where that command is one of them (they come from the router registry, whose import takes scikit-learn
    and SciPy, ~1.5 s): every other command starts without it, and ``proxray --help`` still lists them all."""
    from proxray.cli import routers, serving, tables

    p = argparse.ArgumentParser(prog="proxray", description=OVERVIEW, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    tables.add_import_info(sub)
    routers.add_fit_explain(sub, full=command in (None, "fit"))
    serving.add_serving(sub)
    routers.add_eval(sub, full=command in (None, "eval"))
    tables.add_job(sub)
    return p


def command_of(argv: list) -> str:
    """The command a command line names: its first word that is not an option (the top level takes none but -h);
    "" where it names none (``proxray --help``)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv=None) -> int:
    from proxray.common.cliargs import settle

    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(command_of(argv)).parse_args(argv)
    settle(args)
    try:
        return args.func(args) or 0  # a command may return its exit status (proxray check: 2 when it would not deploy)
    except (ValueError, FileNotFoundError, KeyError) as e:  # ConfigError and TableValidationError too
        print(f"proxray {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
