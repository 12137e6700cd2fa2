"""rotate_quantize.cu's kernels in torch, on any device: their butterfly schedules and their quantization, for
checking on a CPU what the CUDA kernels compute before any GPU runs them.

- `lane_schedule_fwht`: the row kernel's Hadamard, the stages 1, 2, 4 inside a lane (8 values a lane), then
  lane exchanges by XOR shuffles (`__shfl_xor_sync`; the upper lane takes partner - own);
- `column_schedule_fwht`: the column kernels' Hadamard, the stages 1 .. 16 in a thread's registers as loaded
  (C indices 32 w + i), then 32, 64, 128 after the tile's pass through shared memory;
- `emulated_launcher`: a variant's whole pass (pre-scale, flags, rotation, step, codes) as `rotate.self_check`
  and `benchmarks/cuda_rotate.py --smoke` launch it. `rotate.self_check(launch_variant, "cpu")` holds it to
  kernels/ref's codes, steps and flags on planted operands (tests/kernels/test_cuda_build.py).

Every stage pairs the same elements in the same order as kernels/ref's `block_hadamard` (each output exactly
a + b or a - b), so the schedules give the reference's bits, inf - inf included.
"""
from __future__ import annotations

import torch

from kernels.ref import rotated_mm as r_rot


def _in_lane_stages(v: torch.Tensor, regs: int) -> torch.Tensor:
    """Stages pairing registers k and k + h (h = 1, 2, 4, ..) inside each thread; `regs` is the registers' dim."""
    v = v.movedim(regs, -1).clone()
    k = torch.arange(v.shape[-1])
    h = 1
    while h < v.shape[-1]:
        lower = k[(k & h) == 0]
        a, b = v[..., lower], v[..., lower + h]
        v[..., lower], v[..., lower + h] = a + b, a - b
        h *= 2
    return v.movedim(-1, regs)


def _lane_exchanges(v: torch.Tensor, lanes_dim: int) -> torch.Tensor:
    """Stages pairing lane l with lane l ^ m (m = 1 .. 16), as __shfl_xor_sync: the upper lane takes partner - own."""
    v = v.movedim(lanes_dim, -1)
    lanes = torch.arange(32)
    for m in (1, 2, 4, 8, 16):
        other = v[..., lanes ^ m]
        v = torch.where((lanes & m) != 0, other - v, v + other)
    return v.movedim(-1, lanes_dim)


def lane_schedule_fwht(blocks: torch.Tensor) -> torch.Tensor:
    """The row kernel's butterflies: blocks [n, 256] float32 laid out as the kernel holds them ([n, 32 lanes, 8]),
    the in-lane stages, then each lane-exchange stage."""
    v = _in_lane_stages(blocks.reshape(-1, 32, 8), 2)
    return _lane_exchanges(v, 1).reshape(blocks.shape)


def column_schedule_fwht(blocks: torch.Tensor) -> torch.Tensor:
    """The column kernels' butterflies: a thread of warp w loads C indices 32 w + i ([n, 8 warps, 32]) and runs the
    stages 1 .. 16 in its registers; then, through the tile, lane l holds 32 k + l and runs 32, 64, 128."""
    v = _in_lane_stages(blocks.reshape(-1, 8, 32), 2)
    return _in_lane_stages(v, 1).reshape(blocks.shape)


def emulated_launcher(variant: str, g: torch.Tensor, q: torch.Tensor, step: torch.Tensor, bad: torch.Tensor,
                      pre: torch.Tensor | None = None):
    """launch() of the CUDA variant `variant` ("rows", or a column variant) in torch: G's rows ("rows") or the
    columns of g [C, rows], rebuilt as to_int8(o / pre) * pre first when a pre-scale is given; writes the codes,
    steps and flags the kernels write (step amax / 127, taken as 1 for a NaN or zero amax; codes by to_int8)."""
    def launch():
        o = g if variant == "rows" else g.t()  # [rows, C]
        if pre is not None:  # the rebuilt operand, its scale per C index (or one)
            o = r_rot.to_int8(o / pre).to(torch.float32) * pre
        flags = (~torch.isfinite(o)).any(dim=1)
        o = torch.where(torch.isfinite(o), o, torch.zeros_like(o))
        schedule = lane_schedule_fwht if variant == "rows" else column_schedule_fwht
        rot = schedule(o.reshape(-1, 256)).reshape(o.shape)
        nan = torch.isnan(rot).any(dim=1)
        amax = torch.where(torch.isnan(rot), torch.zeros_like(rot), rot.abs()).amax(dim=1)
        st = torch.where(nan, torch.ones_like(amax), amax / torch.full_like(amax, 127.0))
        st = torch.where(st > 0, st, torch.ones_like(st))
        q.copy_(r_rot.to_int8(rot / st[:, None]))
        step.copy_(st)
        bad.copy_(flags.to(torch.int32))
    return launch
