"""Shared helpers as a fixture (tests import no sibling modules under --import-mode=importlib)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch


def make_partials(world: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    """`world` float32 buffers of n elements from numpy's Philox; exponents spread so that sum order shows in the bits."""
    rng = np.random.Generator(np.random.Philox(seed))
    out = []
    for _ in range(world):
        x = rng.standard_normal(n) * np.exp2(rng.integers(-12, 13, n))
        out.append(torch.from_numpy(x.astype(np.float32)))
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Raw-bit equality of two float32 tensors."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32),
                                                                     b.contiguous().view(torch.int32))


def left_to_right(parts: list[torch.Tensor]) -> torch.Tensor:
    acc = parts[0].clone()
    for p in parts[1:]:
        acc = acc + p
    return acc


@pytest.fixture
def h() -> SimpleNamespace:
    return SimpleNamespace(partials=make_partials, same_bits=same_bits, left_to_right=left_to_right)
