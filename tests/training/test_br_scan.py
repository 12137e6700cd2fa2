"""The training bit path, the exact sum's format and its wire use only BR-safe primitives (the kernels' scanner,
docs/architecture.md, contract point 2)."""
import os

from kernels.br_scan import scan_source

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BIT_PATH = ("training/model.py", "training/moe.py", "training/init.py", "training/reduction.py", "training/optim.py",
            "training/step.py", "training/sharding.py", "training/evaluate.py", "collectives/limbs.py",
            "collectives/exact_wire.py")


def test_bit_path_modules_use_only_br_safe_primitives():
    found = []
    for f in BIT_PATH:
        with open(os.path.join(ROOT, f)) as fh:
            found += scan_source(fh.read(), f)
    assert not found, "forbidden primitives:\n" + "\n".join(map(str, found))
