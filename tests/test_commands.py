"""Every `proxray …` command written in the README and the docs runs as written: it parses with the command line
as it is today (no option it does not know, no deprecated spelling), names shipped configs that exist, and gives
what the command refuses without (an --outliers beside a --table for eval, --trust-pickle for a pickled import).
The guides' cluster commands run in their local form in tests/rehearsal.py."""
import re
import shlex

import pytest

from conftest import ROOT

SHIPPED = ("serve_configs/", "jobs/configs/", "monitor_configs/", "deploy/")


def fenced_commands():
    """(file, command) for every shell command in a fenced bash / shell block of README.md and docs/."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", path.read_text(), re.S):
            text = re.sub(r"\\\n\s*", " ", block)  # continuation lines
            for line in text.splitlines():
                line = line.split(" #")[0].strip()
                line = re.sub(r"""^ray exec \S+ (['"])(.*)\1$""", r"\2", line)  # what `ray exec` runs on the head
                for part in re.split(r"&&|;|\|\|", line):
                    part = part.strip()
                    if part.startswith(("proxray ", ".venv/bin/proxray ")):
                        out.append((str(path.relative_to(ROOT)), part))
                    elif " -- proxray " in part:  # ray job submit … -- proxray …
                        out.append((str(path.relative_to(ROOT)), "proxray " + part.split(" -- proxray ", 1)[1]))
        for span in re.findall(r"`((?:\.venv/bin/)?proxray [^`\n]+)`", path.read_text()):
            for part in (p.strip() for p in re.split(r"&&|;", span)):
                words = part.split()
                # a command as written: options with their values, no synopsis ([…], …, |, <…>, PLACEHOLDERS)
                if ("--" in part and not words[-1].startswith("--") and "--help" not in words
                        and not re.search(r"[\[\]…|<>]|\b[A-Z]{3,}\b", part)):
                    out.append((str(path.relative_to(ROOT)), part))
    return out


COMMANDS = fenced_commands()


def test_the_docs_have_commands_to_check():
    assert len(COMMANDS) >= 20 and {f for f, _ in COMMANDS} >= {"README.md", "docs/guides/deploy-on-a-cluster.md"}


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{f}:{c[:60]}" for f, c in COMMANDS])
def test_a_documented_command_runs_as_written(where, command, capsys):
    from proxray.cli import build_parser
    from proxray.common.cliargs import settle

    argv = shlex.split(command)[1:]
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `{command}` does not parse: {capsys.readouterr().err.strip()} ({e})")
    settle(args)
    said = capsys.readouterr().err
    assert "deprecated" not in said and getattr(args, "inv_tau", None) is None, \
        f"{where}: `{command}` uses a deprecated spelling: {said}"
    for value in [v for k, v in vars(args).items() if k in ("config", "table") and v]:
        for v in value if isinstance(value, list) else [value]:
            if str(v).startswith(SHIPPED):
                assert (ROOT / v).exists(), f"{where}: `{command}` names {v}, which is not shipped"
    if args.cmd == "eval" and args.table and not args.outliers:
        pytest.fail(f"{where}: `{command}`: proxray eval refuses --table without --outliers")
    if args.cmd == "import" and (args.format == "hf" or any(p.endswith(".pkl") for p in args.paths)):
        assert args.trust_pickle, f"{where}: `{command}`: reading a pickle needs --trust-pickle"
