"""A static scan of kernels/ref for primitives the BR contract forbids (docs/architecture.md, contract point 2).

Flagged: torch transcendental functions and float reductions, float matmul (`@`, matmul, linear...),
FMA-prone ops, torch RNG, `**`, division by a numeric literal (CUDA multiplies by a reciprocal), and
libm through `math.*`. Calls on our own modules (e.g. `elementary.exp`) are allowed. A line that uses
a flagged name legitimately (an int64 `.sum()`, the float64 sqrt building block) says why in a
trailing `# br-ok: <reason>` comment.
"""
from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass

FORBIDDEN = {
    # transcendental (differ across devices: docs/architecture.md, measured facts)
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh",
    "sigmoid", "silu", "gelu", "pow", "float_power", "erf", "erfinv", "atan2", "softplus",
    # float reductions in device order
    "sum", "nansum", "mean", "nanmean", "norm", "vector_norm", "softmax", "log_softmax", "cumsum",
    "cumprod", "logsumexp", "var", "std", "prod", "trace",
    # float contractions
    "matmul", "mm", "bmm", "einsum", "linear", "addmm", "addbmm", "baddbmm", "addmv", "mv", "inner",
    "tensordot", "scaled_dot_product_attention", "conv1d", "conv2d",
    # fused multiply-add prone
    "addcmul", "addcdiv", "lerp", "fma",
    # order-dependent accumulation with duplicate indices
    "index_add", "index_add_", "scatter_add", "scatter_add_", "index_reduce", "scatter_reduce",
    # torch RNG and compilation
    "rand", "randn", "randint", "rand_like", "randn_like", "normal_", "uniform_", "bernoulli",
    "multinomial", "randperm", "manual_seed", "compile",
}
MATH_ALLOWED = {"factorial", "inf", "nan", "isfinite", "isnan", "isinf"}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def _module_aliases(tree: ast.AST) -> set[str]:
    """Names bound to our own modules by imports (calls through them are our functions)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kernels"):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("kernels"))
    return names


def _int_literals(*nodes) -> bool:
    """True when every node is an integer literal (integer powers are exact)."""
    return all(isinstance(n, ast.Constant) and type(n.value) is int for n in nodes)


def scan_source(src: str, path: str = "<src>") -> list[Violation]:
    tree = ast.parse(src)
    lines = src.splitlines()
    ours = _module_aliases(tree)
    found = []

    def flag(node, what):
        text = lines[node.lineno - 1] if node.lineno - 1 < len(lines) else ""
        if "# br-ok:" not in text:
            found.append(Violation(path, node.lineno, what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id == "math" and node.attr not in MATH_ALLOWED:
                flag(node, f"math.{node.attr} (libm differs across platforms)")
            elif node.attr in FORBIDDEN and not (isinstance(base, ast.Name) and base.id in ours):
                flag(node, f".{node.attr} (forbidden primitive)")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
            for a in node.names:
                if a.name in FORBIDDEN:
                    flag(node, f"from {node.module} import {a.name}")
        elif isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.MatMult):
                flag(node, "@ (float matmul)")
            elif isinstance(node.op, ast.Pow) and not _int_literals(node.left, node.right):
                flag(node, "** (pow)")
            elif isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant) \
                    and isinstance(node.right.value, (int, float)):
                flag(node, "division by a numeric literal (multiply by a reciprocal)")
    return found


def scan_tree(root: str) -> list[Violation]:
    """Violations in every .py file under `root`."""
    out = []
    for dirpath, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".py"):
                p = os.path.join(dirpath, f)
                with open(p) as fh:
                    out.extend(scan_source(fh.read(), p))
    return out


if __name__ == "__main__":
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref")
    vs = scan_tree(root)
    for v in vs:
        print(v)
    print(f"{len(vs)} violation(s) in {root}")
    sys.exit(1 if vs else 0)
