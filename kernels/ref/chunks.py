"""Elementwise passes over a large tensor, a chunk at a time on a CPU.

A chain of eager int64 and float64 passes streams every temporary through memory; taken a chunk of CPU_CHUNK
elements at a time, the temporaries stay in a CPU's cache (the Philox draws of an init, the exact sum's digits).
The passes are elementwise, so where the chunks end changes no bit. Other devices take a tensor whole: one launch
per pass.
"""
from __future__ import annotations

import torch

CPU_CHUNK = 1 << 16


def spans(n: int, device=None) -> list[tuple[int, int]]:
    """[start, stop) spans covering n elements: CPU_CHUNK at a time on a CPU, one span elsewhere (none for n = 0)."""
    step = CPU_CHUNK if torch.device(device or "cpu").type == "cpu" else max(n, 1)
    return [(a, min(a + step, n)) for a in range(0, n, step)]
