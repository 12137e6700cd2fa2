"""Per-window gradients from windows computed together.

A step's gradient is the exact mean of its windows' own gradients: each window's gradient is what the model gives
for that window alone, every data-dependent group (the int8 backward's steps and Hadamard blocks over tokens, the
exact sums behind a norm gain's or the embedding's gradient, the loss's mean) within the window. So how the step's
windows are cut into microbatches, and over how many ranks, changes no bit.

The windows of a microbatch still run as one batch where a window's rows do not meet: the int8 linears' forward and
their activation gradients, attention, the gain-free norms, the SwiGLU. Only what turns tokens into a parameter
gradient runs window by window. For that, a parameter enters the forward as one leaf per window (`leaves`), each
sharing the parameter's storage, and window i's computation reads leaf i, so that autograd delivers window i's
gradient to leaf i alone, never summed with another window's.

The wrappers below take either a tensor (shared by every window of the batch: evaluation, calibration, a whole
batch's gradient) or a tuple of per-window tensors, and give the same forward bits either way.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from kernels.ref.hadamard import DEFAULT_BLOCK
from kernels.ref.int8_linear import validate as validate_int8_linear

Param = torch.Tensor | tuple[torch.Tensor, ...]


def leaves(params: dict[str, torch.Tensor], windows: int) -> dict[str, tuple[torch.Tensor, ...]]:
    """`windows` autograd leaves per parameter, each a view of the parameter's storage (no copy)."""
    return {k: tuple(v.detach().requires_grad_(True) for _ in range(windows)) for k, v in params.items()}


class Window(Mapping):
    """Window i's view of a parameter dict: per-window tuples give their i-th tensor, shared tensors themselves."""

    def __init__(self, params: Mapping[str, Param], i: int) -> None:
        self.params, self.i = params, i

    def __getitem__(self, name: str) -> torch.Tensor:
        v = self.params[name]
        return v[self.i] if isinstance(v, tuple) else v

    def __iter__(self):
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def _shared(p: Param) -> torch.Tensor | None:
    """The one tensor behind `p` when every window reads the same tensor, else None."""
    if isinstance(p, torch.Tensor):
        return p
    return p[0] if all(t is p[0] for t in p) else None


def per_window(fn, x: torch.Tensor, *params: Param) -> torch.Tensor:
    """fn(x, *params) over a batch x [windows, ...]: one call when the params are shared, else one call per window
    (on its own row of x and its own leaves), stacked; stacking's backward hands each window its rows' gradient."""
    shared = [_shared(p) for p in params]
    if all(s is not None for s in shared):
        return fn(x, *shared)
    return torch.stack([fn(x[i], *(p[i] if isinstance(p, tuple) else p for p in params)) for i in range(x.shape[0])])


class _WindowedInt8Linear(torch.autograd.Function):
    """y = int8_linear(x, w, s_x) for x [windows, T, K], one (w, s_x) leaf pair per window, all equal: the forward
    runs once over the batch, and so does dx (a row's dx depends on its own row only); window i's dw and ds_x are
    its tokens' alone (its own per-row steps and Hadamard blocks along T) and go to its leaves."""

    @staticmethod
    def forward(ctx, mod, rotate, block, x, *params):
        n = x.shape[0]
        w, s_x = params[0], params[n]
        ctx.mod, ctx.rotate, ctx.block, ctx.n = mod, rotate, block, n
        ctx.save_for_backward(x, w, s_x)
        return mod.int8_linear_forward(x, w, s_x)

    @staticmethod
    def backward(ctx, g):
        x, w, s_x = ctx.saved_tensors
        n, needs = ctx.n, ctx.needs_input_grad
        dx, dws, dss = ctx.mod.int8_linear_backward_windows(
            g.contiguous(), x, w, s_x, rotate=ctx.rotate, block=ctx.block,
            needs=(needs[3], any(needs[4:4 + n]), any(needs[4 + n:4 + 2 * n])))
        dws = [dw.to(w.dtype) if dw is not None and needs[4 + i] else None for i, dw in enumerate(dws)]
        dss = [ds if needs[4 + n + i] else None for i, ds in enumerate(dss)]
        return (None, None, None, dx, *dws, *dss)


def int8_linear(ops, x: torch.Tensor, w: Param, s_x: Param, *, rotate: bool = True,
                block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """ops.int8_linear.int8_linear over a batch of windows x [windows, T, K], with per-window gradients when `w`
    and `s_x` are per-window tuples (module doc)."""
    ws, ss = _shared(w), _shared(s_x)
    if ws is not None and ss is not None:
        return ops.int8_linear.int8_linear(x, ws, ss, rotate=rotate, block=block)
    n = x.shape[0]
    w = w if isinstance(w, tuple) else (w,) * n
    s_x = s_x if isinstance(s_x, tuple) else (s_x,) * n
    if len(w) != n or len(s_x) != n:
        raise ValueError(f"int8_linear: {len(w)} weights and {len(s_x)} steps for {n} windows")
    validate_int8_linear(x, w[0], s_x[0], block)
    return _WindowedInt8Linear.apply(ops.int8_linear, rotate, block, x, *w, *s_x)
