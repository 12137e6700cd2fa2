"""No forbidden primitive in kernels/ref bit paths (docs/architecture.md, contract point 2)."""
import os

from kernels.br_scan import scan_source, scan_tree

REF = os.path.join(os.path.dirname(__file__), "..", "..", "kernels", "ref")


def test_reference_backend_uses_only_br_safe_primitives():
    violations = scan_tree(REF)
    assert not violations, "forbidden primitives:\n" + "\n".join(map(str, violations))


def test_scanner_catches_each_kind_of_violation():
    src = "\n".join([
        "import math",
        "import torch",
        "from kernels.ref import elementary as E",
        "a = torch.exp(x)",            # transcendental
        "b = x.sum(dim=0)",            # float reduction as a method
        "c = x @ w",                   # float matmul
        "d = x / 3.0",                 # division by a literal
        "e = math.cos(0.5)",           # libm on the host
        "f = x ** 0.5",                # pow
        "g = torch.randn(3)",          # torch RNG
        "h = E.exp(x)",                # ours: allowed
        "i = x.sum()  # br-ok: int64",  # annotated: allowed
        "j = 2 ** 32",                 # integer power: allowed
    ])
    lines = sorted(v.line for v in scan_source(src))
    assert lines == [4, 5, 6, 7, 8, 9, 10]
