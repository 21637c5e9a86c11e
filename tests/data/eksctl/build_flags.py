"""Writes flags.json beside it: the flags (long names, and short ones) of each eksctl command the guides run, read
from eksctl's own source at one tag — each command's file under ``pkg/ctl`` and the ``cmdutils`` helpers it calls,
followed into each other. tests/test_cluster_guide.py checks the guides' eksctl commands against it.

    python tests/data/eksctl/build_flags.py <a clone of github.com/eksctl-io/eksctl at the tag> [tag]
"""
import json
import re
import subprocess
import sys
from pathlib import Path

COMMANDS = {  # the guides' commands -> the file that defines each
    "create nodegroup": "pkg/ctl/create/nodegroup.go",
    "create iamserviceaccount": "pkg/ctl/create/iamserviceaccount.go",
    "utils associate-iam-oidc-provider": "pkg/ctl/utils/associate_iam_oidc_provider.go",
    "scale nodegroup": "pkg/ctl/scale/nodegroup.go",
}
# a flag defined on a pflag.FlagSet (``fs.StringVarP(&x, "name", "n", …)``, ``fs.IntP("nodes", "N", …)``), or on the root
# command's persistent flags (help, verbose, color, dumpLogs: every command takes them)
FLAG = re.compile(r'\b(?:fs|PersistentFlags\(\))\.[A-Z][A-Za-z0-9]*\(\s*(?:[^,"()]+(?:\([^()]*\))?\s*,\s*)?"([a-zA-Z0-9-]+)"'
                  r'(?:\s*,\s*"([a-zA-Z]?)")?')
NAMED = re.compile(r'\bAdd[A-Za-z]*Flag\(fs,\s*[^,]+,\s*"([a-z0-9-]+)"')  # a helper given the flag's name
HELPER = re.compile(r"\b(Add[A-Z][A-Za-z0-9]*|add[A-Z][A-Za-z0-9]*)\(")


def show(repo: Path, path: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "show", f"HEAD:{path}"], capture_output=True, text=True,
                          check=True).stdout


def functions(source: str) -> dict:
    """{name: body} of the Go functions in ``source`` (a body from its ``{`` to the matching ``}``)."""
    out = {}
    for m in re.finditer(r"^func (?:\([^)]*\) )?([A-Za-z0-9_]+)\(", source, re.M):
        start = source.index("{", source.index(")", m.end()))  # after the parameters
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            if depth == 0:
                break
            i += 1
        out[m.group(1)] = source[start:i + 1]
    return out


def flags_of(body: str, helpers: dict, seen: set) -> set:
    found = set(NAMED.findall(body))
    for m in FLAG.finditer(body):
        found.add(m.group(1))
        if m.group(2):
            found.add(m.group(2))
    for m in HELPER.finditer(body):
        name = m.group(1) or m.group(2)
        if name in helpers and name not in seen:
            seen.add(name)
            found |= flags_of(helpers[name], helpers, seen)
    return found


def main(repo: str, tag: str = "") -> None:
    repo = Path(repo)
    listed = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", "pkg/ctl/cmdutils"],
                            capture_output=True, text=True, check=True).stdout.split()
    helpers = {}
    for path in listed:
        if path.endswith(".go") and not path.endswith("_test.go"):
            helpers.update(functions(show(repo, path)))
    out = {"eksctl": tag or subprocess.run(["git", "-C", str(repo), "describe", "--tags"], capture_output=True,
                                           text=True).stdout.strip(), "commands": {}}
    root = flags_of(show(repo, "cmd/eksctl/main.go"), {}, set())
    for command, path in COMMANDS.items():
        source = show(repo, path)
        own = functions(source)
        out["commands"][command] = sorted(flags_of(source, {**helpers, **own}, set()) | root)
    (Path(__file__).with_name("flags.json")).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
