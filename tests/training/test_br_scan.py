"""The training bit path uses only BR-safe primitives (the kernels' scanner, docs/architecture.md, contract point 2)."""
import os

from kernels.br_scan import scan_source

LIB = os.path.join(os.path.dirname(__file__), "..", "..", "training")
BIT_PATH = ("model.py", "moe.py", "init.py", "reduction.py", "optim.py", "step.py", "sharding.py", "evaluate.py")


def test_bit_path_modules_use_only_br_safe_primitives():
    found = []
    for f in BIT_PATH:
        with open(os.path.join(LIB, f)) as fh:
            found += scan_source(fh.read(), f)
    assert not found, "forbidden primitives:\n" + "\n".join(map(str, found))
