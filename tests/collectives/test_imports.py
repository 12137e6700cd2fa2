import ast
from pathlib import Path

import collectives

FORBIDDEN = {"pickle", "ray"}  # the package layering itself: tests/test_layering.py


def test_collectives_import_no_ray_and_never_unpickle():
    """Collectives run inside any process group: no ray import; spills never pickle."""
    for path in Path(collectives.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{path.name} imports {n}"


def test_no_division_by_a_python_scalar_in_bit_paths():
    """Averages go through reciprocal(); no `tensor / n` in the package (CUDA and CPU round it differently)."""
    for path in Path(collectives.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                host_reciprocal = isinstance(node.left, ast.Constant)  # 1.0 / n on the host
                path_join = isinstance(node.right, ast.JoinedStr) or (
                    isinstance(node.right, ast.Constant) and isinstance(node.right.value, str))  # Path / "name"
                assert host_reciprocal or path_join, f"{path.name}:{node.lineno}: division outside reciprocal()"
