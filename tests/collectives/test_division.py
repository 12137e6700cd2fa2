import ast
from pathlib import Path

import collectives


def test_no_division_by_a_python_scalar_in_bit_paths():
    """Averages go through reciprocal(); no `tensor / n` in the package (CUDA and CPU round it differently)."""
    for path in Path(collectives.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                host_reciprocal = isinstance(node.left, ast.Constant)  # 1.0 / n on the host
                path_join = isinstance(node.right, ast.JoinedStr) or (
                    isinstance(node.right, ast.Constant) and isinstance(node.right.value, str))  # Path / "name"
                assert host_reciprocal or path_join, f"{path.name}:{node.lineno}: division outside reciprocal()"
