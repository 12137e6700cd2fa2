import ast
from pathlib import Path

import quant

FORBIDDEN = {"pickle"}  # the package layering itself: tests/test_layering.py


def test_quant_never_unpickles():
    """Nothing in quant unpickles."""
    for path in Path(quant.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{path.name} imports {n}"
        assert "torch.load(" not in path.read_text(), f"{path.name} calls torch.load (pickle)"
