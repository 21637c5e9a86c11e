"""The package's modules import one another without a circle: every import counted, at module level or deferred
inside a function (a deferred import is still an arrow), ``from a.b import c`` an arrow to ``a.b.c`` where that is a
module, else to ``a.b``. No Ray, nothing imported: the source is read."""
import ast

from conftest import ROOT


def _graph() -> dict:
    pkg = ROOT / "proxray"
    modules = {}
    for path in pkg.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph = {m: set() for m in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package up
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for t in targets:
                while t and t not in modules and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in modules and t != name and t != "proxray":
                    graph[name].add(t)
    return graph


def _circles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_without_a_circle():
    graph = _graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the graph read is the package's
    assert _circles(graph) == []


def test_the_check_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
