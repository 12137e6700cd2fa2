import ast
from pathlib import Path

import stream

FORBIDDEN = {"torch", "pickle"}  # the package layering itself: tests/test_layering.py


def test_stream_needs_no_torch_and_never_unpickles():
    """Stream needs no torch (a corpus is prepared without it) and never unpickles."""
    for path in Path(stream.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for n in names:
                assert n.split(".")[0] not in FORBIDDEN, f"{path.name} imports {n}"
