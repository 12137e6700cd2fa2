"""The package layering (docs/architecture.md): imports point down, never up or sideways, and no two modules import
each other, directly or round a longer cycle. Function-local imports count: hiding a back-import in a function
does not make it a layer below."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# rank of each package: a module may import its own package and packages of a lower rank only
RANKS = {"kernels": 0, "stream": 0, "collectives": 0, "training": 1, "replay": 2, "quant": 2, "app": 3}
# what some packages must not import beyond that: the stream prepares corpora without torch, the collectives run in
# any process group (no ray), and nothing unpickles (checkpoints and ARVQ files are safetensors and JSON)
NEVER = {"stream": {"torch", "pickle"}, "collectives": {"ray", "pickle"}, "quant": {"pickle"}, "training": {"pickle"},
         "replay": {"pickle"}}


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _names(path: Path) -> set[str]:
    """Every module name `path` imports, ours or not, as written (relative imports left out)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _imports(root: Path, path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports (a `from pkg import name` naming a submodule counts as that module)."""
    me = _module_name(root, path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level-1 packages
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules)
    return {m for m in out if m.split(".")[0] in RANKS and m in modules}


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports, over every package of RANKS under `root`."""
    files = {_module_name(root, p): p for pkg in RANKS for p in sorted((root / pkg).rglob("*.py"))}
    modules = set(files)
    return {m: _imports(root, p, modules) - {m} for m, p in files.items()}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a package that is not below the importer's (sideways or up)."""
    bad = []
    for m, deps in sorted(graph.items()):
        mine = m.split(".")[0]
        for d in sorted(deps):
            theirs = d.split(".")[0]
            if theirs != mine and RANKS[theirs] >= RANKS[mine]:
                bad.append(f"{m} imports {d} ({theirs} is not below {mine})")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_import_points_down_a_layer():
    assert layer_violations(import_graph(ROOT)) == []


def test_no_modules_import_each_other():
    assert cycles(import_graph(ROOT)) == []


def test_packages_keep_their_own_rules():
    for pkg, never in NEVER.items():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            bad = sorted(n for n in _names(path) if n.split(".")[0] in never)
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"
            assert "torch.load(" not in path.read_text(), f"{path.relative_to(ROOT)} calls torch.load (a pickle)"


def test_no_test_imports_a_benchmark():
    """Benchmarks are scripts over the library; what a test needs lives in the library."""
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "benchmarks" for n in names), f"{path} imports {names}"


def _tree(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    for pkg in RANKS:
        (tmp / pkg).mkdir(exist_ok=True)
        (tmp / pkg / "__init__.py").touch()
    return tmp


def test_the_checks_catch_a_back_import_and_a_cycle(tmp_path):
    """The checker itself: a function-local import of a package above, a sideways import, and a cycle of three."""
    root = _tree(tmp_path, {
        "training/step.py": "def f():\n    from replay import core\n",
        "replay/core.py": "import training.step\n",
        "quant/pv.py": "from replay.core import x\n",
        "kernels/a.py": "from kernels import b\n", "kernels/b.py": "from . import c\n", "kernels/c.py": "import kernels.a\n",
        "stream/ok.py": "import kernels.a\n"})
    g = import_graph(root)
    assert layer_violations(g) == [
        "quant.pv imports replay.core (replay is not below quant)",
        "stream.ok imports kernels.a (kernels is not below stream)",
        "training.step imports replay (replay is not below training)",
        "training.step imports replay.core (replay is not below training)"]
    assert cycles(g) == [["kernels.a", "kernels.b", "kernels.c"], ["replay.core", "training.step"]]
