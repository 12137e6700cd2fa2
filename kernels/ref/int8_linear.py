"""OPEN-1B's int8 W8A8 QAT linear (paper sections 3.2 and 4.2): y = x_hat w_hat^T, no bias.

Forward: weights get one step per output channel, re-pinned on every call to the LSQ initialization
    s_w[n] = 2 * mean_k |w[n, k]| / sqrt(127)
(a function of w, not a parameter: it cannot drift away from the weights, section 4.2); activations get
one learned per-tensor step s_x (LSQ). q = clamp(round_half_even(v / s), -127, 127); the int8 x int8
product accumulates exactly in int32; y = float32(acc) * (s_x * s_w[n]).

Backward (straight-through estimator): both gradient GEMMs run in int8 with a block Walsh-Hadamard
rotation along their contraction dim (kernels/ref/rotated_mm.py):
    dx_hat = G w_hat   (contract over N),  dx = dx_hat where |x / s_x| <= 127, else 0
    dw_hat = G^T x_hat (contract over M),  dw = dw_hat where |w / s_w| <= 127, else 0
    ds_x   = sum_i dx_hat_i * d x_hat_i / d s_x  *  1 / sqrt(numel(x) * 127)     (LSQ)
with d x_hat / d s = round(v) - v inside the range and +-127 at or beyond it. The re-pinned s_w gets no
gradient: it is a definition, not a learned value, so the path w -> s_w is ignored (the STE treats
w_hat as w inside the range). w_hat and x_hat are the forward's dequantized operands, so the
gradients are those of the function the forward computed.
"""
from __future__ import annotations

import torch

from kernels.ref import fixed
from kernels.ref.checks import expect, same_device
from kernels.ref.elementary import rsqrt_
from kernels.ref.hadamard import DEFAULT_BLOCK, padded_length
from kernels.ref.intmm import int8_mm
from kernels.ref.reduce import dot, exact_mean
from kernels.ref.rotated_mm import MAX_CONTRACTION, QMAX, rotated_int8_mm, to_int8

OP = "int8_linear"
F32 = torch.float32


def repin_constant(device=None) -> torch.Tensor:
    """float32(2 / sqrt(127)) as a 0-dim tensor: our own rsqrt (no libm), times 2 (exact)."""
    r = rsqrt_(torch.tensor(float(QMAX), dtype=F32, device=device))
    return r * torch.tensor(2.0, dtype=F32, device=device)


def weight_step(w: torch.Tensor) -> torch.Tensor:
    """Re-pinned per-output-channel step s_w [N] of w [N, K]: float32(exact mean |w|) * float32(2/sqrt(127)).

    An all-zero row (or one whose step underflows) gets step 1, so its codes are 0 rather than NaN.
    """
    mean_abs = exact_mean(w.to(F32).abs(), dim=1)  # exact int64 sum, one rounding to float32
    s = mean_abs * repin_constant(w.device)
    return torch.where(s > 0, s, torch.ones_like(s))


def quantize_weight(w: torch.Tensor, s_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes q_w [N, K], ratio w / s_w as float32): tensor / tensor division, BR-safe."""
    v = w.to(F32) / s_w[:, None]
    return to_int8(v), v


def quantize_activation(x: torch.Tensor, s_x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes q_x, ratio x / s_x as float32): division by the 0-dim step tensor, not a Python scalar."""
    v = x / s_x
    return to_int8(v), v


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def int8_linear_forward(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor) -> torch.Tensor:
    """y [..., N] float32 without autograd (module doc). Non-finite x rows, w rows or s_x give NaN."""
    x2 = _flat(x)
    s_w = weight_step(w)
    q_w, _ = quantize_weight(w, s_w)
    q_x, _ = quantize_activation(x2, s_x)
    acc = int8_mm(q_x, q_w.t())
    # bit-relevant order: the per-channel product s_x * s_w[n] first, then float32(acc) times it
    y = acc.to(F32) * (s_x * s_w)
    bad = fixed.nonfinite_along(x2, 1) | fixed.nonfinite_along(w, 1).t() | ~torch.isfinite(s_x)
    y = torch.where(bad, torch.full_like(y, float("nan")), y)
    return y.reshape(*x.shape[:-1], w.shape[0])


def lsq_step_factor(v: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """d x_hat / d s for x_hat = s * clamp(round(v)): round(v) - v inside, +-127 at or beyond the range.

    At |v| == 127 exactly, round(v) stays 127 on both sides, so the derivative there is +-127 (LSQ's >=).
    """
    qmax = torch.full_like(v, float(QMAX))
    return torch.where(v >= QMAX, qmax, torch.where(v <= -QMAX, -qmax, q.to(F32) - v))


def lsq_grad_scale(numel: int, device=None) -> torch.Tensor:
    """LSQ's step-gradient scale 1/sqrt(numel * 127) as a 0-dim float32 (our rsqrt, no libm)."""
    n = torch.tensor(float(numel * QMAX), dtype=F32, device=device)  # one host rounding to float32
    return rsqrt_(n)


def int8_linear_backward(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, *,
                         rotate: bool = True, block: int = DEFAULT_BLOCK,
                         needs: tuple[bool, bool, bool] = (True, True, True), s_w: torch.Tensor | None = None,
                         ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(dx like x, dw float32 [N, K], ds_x 0-dim float32) for upstream g [..., N] (module doc).

    Everything is recomputed from (x, w, s_x) with the forward's functions, so it has the forward's bits.
    s_w: w's step (weight_step(w)) when the caller has it, else it is taken here.
    """
    return as_one_window(int8_linear_backward_windows, g, x, w, s_x, rotate=rotate, block=block, needs=needs, s_w=s_w)


def as_one_window(backward_windows, g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, **kw):
    """(dx, dw, ds_x) of one call through a windows backward (this module's or a twin's): x's rows as one window."""
    dx, dw, ds = backward_windows(g[None], x[None], w, s_x, **kw)
    return None if dx is None else dx[0], dw[0], ds[0]


def int8_linear_backward_windows(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, *,
                                 rotate: bool = True, block: int = DEFAULT_BLOCK,
                                 needs: tuple[bool, bool, bool] = (True, True, True),
                                 s_w: torch.Tensor | None = None,
                                 ) -> tuple[torch.Tensor | None, list[torch.Tensor | None], list[torch.Tensor | None]]:
    """int8_linear_backward of each window of a batch g [W, ..., N], x [W, ..., K]: (dx like x, [dw of window i],
    [ds_x of window i]), the bits of W calls on the windows one by one.

    A row's dx_hat contracts that row of G with w_hat (steps per row of G, Hadamard blocks along N), so dx and
    dx_hat run over the batch at once; dw (steps and blocks along the tokens) and ds_x (an exact sum over the
    window's elements, scaled by its numel) are the window's own."""
    need_x, need_w, need_s = needs
    windows = x.shape[0]
    g2, x2 = _flat(g), _flat(x)
    rows = x2.shape[0] // windows
    part = [slice(i * rows, (i + 1) * rows) for i in range(windows)]
    s_w = weight_step(w) if s_w is None else s_w
    q_w, v_w = quantize_weight(w, s_w)
    q_x, v_x = quantize_activation(x2, s_x)  # elementwise: the same codes window by window
    dx, dws, dss = None, [None] * windows, [None] * windows
    if need_x or need_s:
        dx_hat = rotated_int8_mm(g2, q_w.to(F32) * s_w[:, None], rotate=rotate, block=block)  # contract over N
        if need_x:
            dx = torch.where(v_x.abs() <= QMAX, dx_hat, torch.zeros_like(dx_hat)).reshape(x.shape)
        if need_s:
            # exact dot (float64 products, int64 sum), one rounding, then the LSQ scale
            f, scale = lsq_step_factor(v_x, q_x), lsq_grad_scale(x[0].numel(), x.device)
            dss = [dot(dx_hat[p].reshape(-1), f[p].reshape(-1)) * scale for p in part]
    if need_w:
        x_hat = q_x.to(F32) * s_x
        for i, p in enumerate(part):
            dw_hat = rotated_int8_mm(g2[p].t(), x_hat[p], rotate=rotate, block=block)  # contract over the tokens
            dws[i] = torch.where(v_w.abs() <= QMAX, dw_hat, torch.zeros_like(dw_hat))
    return dx, dws, dss


class _Int8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, s_x, rotate, block):
        ctx.save_for_backward(x, w, s_x)
        ctx.rotate, ctx.block = rotate, block
        return int8_linear_forward(x, w, s_x)

    @staticmethod
    def backward(ctx, g):
        x, w, s_x = ctx.saved_tensors
        dx, dw, ds = int8_linear_backward(g.contiguous(), x, w, s_x, rotate=ctx.rotate, block=ctx.block,
                                          needs=tuple(ctx.needs_input_grad[:3]))
        if dw is not None:
            dw = dw.to(w.dtype)  # a bf16 weight's gradient is bf16 (round to nearest even, BR-safe cast)
        return dx, dw, ds, None, None


def validate(x, w, s_x, block: int) -> None:
    """ValueError naming the argument when (x, w, s_x, block) is not a call this op takes."""
    expect(OP, "x", x, dtype=F32)
    if x.dim() < 1 or x.numel() == 0:
        raise ValueError(f"{OP}: argument 'x' must be [..., K] with at least one element, got {tuple(x.shape)}")
    k = x.shape[-1]
    expect(OP, "w", w, dtype=(F32, torch.bfloat16), ndim=2, shape=(None, k))
    if w.shape[0] == 0:
        raise ValueError(f"{OP}: argument 'w' must have at least one output row, got {tuple(w.shape)}")
    expect(OP, "s_x", s_x, dtype=F32, ndim=0)
    same_device(OP, x=x, w=w, s_x=s_x)
    if not isinstance(block, int) or block < 1 or block & (block - 1):
        raise ValueError(f"{OP}: argument 'block' must be a power of two, got {block}")
    m = x.numel() // k
    for name, c in (("x", k), ("w", padded_length(w.shape[0], block)), ("x", padded_length(m, block))):
        if c > MAX_CONTRACTION:
            raise ValueError(f"{OP}: argument {name!r} gives a contraction of {c} > {MAX_CONTRACTION} (int32 overflow)")


def int8_linear(x: torch.Tensor, w: torch.Tensor, s_x: torch.Tensor, *, rotate: bool = True,
                block: int = DEFAULT_BLOCK) -> torch.Tensor:
    """int8 W8A8 QAT linear: x float32 [..., K], w float32/bf16 [N, K], s_x 0-dim float32 (> 0) -> y [..., N].

    `rotate=False` skips the backward's Hadamard rotation (for measurement only); `block` is its block size.
    """
    validate(x, w, s_x, block)
    return _Int8Linear.apply(x, w, s_x, rotate, block)


__all__ = ["int8_linear", "int8_linear_forward", "int8_linear_backward", "int8_linear_backward_windows", "validate",
           "weight_step", "repin_constant", "quantize_weight", "quantize_activation", "lsq_step_factor", "lsq_grad_scale"]
