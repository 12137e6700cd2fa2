import ast
from pathlib import Path

import stream

FORBIDDEN = {"kernels", "app", "collectives", "replay", "quant", "torch", "pickle"}


def test_stream_imports_none_of_the_other_packages():
    """Dependencies point one way (ARCHITECTURE.md): stream stands alone, and never unpickles."""
    for path in Path(stream.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{path.name} imports {n}"
