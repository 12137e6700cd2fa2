"""Op cases: every op, forward and backward, at several shapes, on inputs drawn from our own Philox.

One registry feeds the golden digests (tests/kernels/test_golden.py), the cross-process, ARM and GPU
parity runs, the self-check table of `make demo` and benchmarks/ops.py. A case returns named output
tensors (forward outputs and gradients); their digests are what must match everywhere.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import torch

GROUPS = ("core", "linear", "nn", "attention")


@dataclass(frozen=True)
class Case:
    op: str                                              # op name, e.g. "rmsnorm"
    shape: str                                           # shape label, e.g. "7x33"
    run: Callable[[torch.device], dict[str, torch.Tensor]]

    @property
    def name(self) -> str:
        return f"{self.op}[{self.shape}]"


def registry(groups=GROUPS) -> list[Case]:
    """All cases of the groups whose modules exist (kernels/cases/<group>.py defines CASES)."""
    cases: list[Case] = []
    for g in groups:
        try:
            mod = importlib.import_module(f"kernels.cases.{g}")
        except ModuleNotFoundError as e:
            if e.name != f"kernels.cases.{g}":
                raise
            continue
        cases.extend(mod.CASES)
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"kernels.cases: duplicate case names {sorted(dup)}")
    return cases


def leaf(t: torch.Tensor, device) -> torch.Tensor:
    """A fresh leaf on `device` that records gradients."""
    return t.detach().to(device).clone().requires_grad_(True)


def seed_of(name: str) -> int:
    """A fixed seed per case name (FNV-1a over the bytes: never Python's randomized hash())."""
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def run_case(case: Case, device) -> dict[str, torch.Tensor]:
    """Run one case on `device` and return its outputs on the CPU."""
    out = case.run(torch.device(device))
    return {k: v.detach().to("cpu") for k, v in out.items()}
