"""A cold expert as PV tunes it: float latents behind the rvq256_256x8 grid, decoded with straight-through
projection, and its forward on routed rows in BR ops (the ARVQ write-up, sections 4 and 6).

Latents: per projection, codebooks c [2, 256, 8] (float, clamped to [-6, 6]) and log block scales
l [N, K/128] (clamped to l0 +- 0.35). The forward always uses the projected values, the ones the packed
export stores: atoms fp4(c), scales e4m3(exp(l)) * global, decoded exactly as quant.format does, so the
tuned forward and the reloaded export are the same numbers. Latents keep sub-grid Adam steps (a 0.048
step could never cross a 0.25 half-spacing if the latent itself were snapped every update).

Gradients (`_Decode.backward`) are BR: the codebook gradient sums each atom's groups in int64 fixed point
(index_add of integers: exact in any order), the scale gradient is an exact sum per 128-column block.
The forward is the donor's int8 W8A8 expert with the decoded weights; `emulate=True` swaps in the ARVQ
write-up's serving emulation x -> FP4 activation planes -> hp_matmul(W13) -> fp16 SwiGLU fp16 -> hp_matmul(W2), with
straight-through gradients at each rounding boundary.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.ref import fixed
from kernels.ref.contraction import hp_matmul
from kernels.ref.elementary import exp_, log_
from kernels.ref.reduce import exact_sum
from kernels.ref.int8_linear import int8_linear
from kernels.ref.swiglu import swiglu
from quant.format import GROUP, GROUPS_PER_BLOCK, SCALE_BLOCK, RVQProjection, decode_parts
from quant.fp_formats import e4m3_decode, e4m3_encode, fp4_decode, fp4_encode, fp4_round

F32 = torch.float32
ATOM_MAX = 6.0
LOG_SCALE_RANGE = 0.35
ZERO_LOG = -200.0  # exp(-200) is 0 in float32


@dataclass
class Latent:
    """One expert projection's trainable latents, its fixed indices, the anchors and the global."""
    books: torch.Tensor      # float32 [2, 256, 8]
    logs: torch.Tensor       # float32 [N, K/128]
    idx: torch.Tensor        # int64 [N, K/8, 2]
    books0: torch.Tensor     # anchors (the initial values): drift penalties and the scale clamp
    logs0: torch.Tensor
    glob: torch.Tensor       # float32 0-dim

    @classmethod
    def from_projection(cls, p: RVQProjection, slot: int) -> "Latent":
        books = fp4_decode(p.codebooks[slot]).clone()
        sig = e4m3_decode(p.scales[slot].view(torch.uint8))
        # exp(log(s)) must land back on s's E4M3 code: our log/exp are < 1 ulp, E4M3 steps are 2^-3;
        # a zero scale gets a log whose exp underflows to 0 (and stays there: the clamp is +-0.35)
        logs = torch.where(sig > 0, log_(torch.where(sig > 0, sig, torch.ones_like(sig))),
                           torch.full_like(sig, ZERO_LOG))
        return cls(books, logs, p.indices[slot].long().clone(), books.clone(), logs.clone(),
                   p.global_scale.clone())

    def atoms(self) -> torch.Tensor:
        return fp4_round(self.books)

    def scale_codes(self) -> torch.Tensor:
        """uint8 E4M3 codes of the projected scales."""
        return e4m3_encode(exp_(self.logs))

    def weight(self) -> torch.Tensor:
        """The projected float32 weight [N, K] (no autograd): what the export decodes to."""
        return decode_parts(self.atoms(), self.idx, self.scale_codes().view(torch.float8_e4m3fn), self.glob)

    def project_(self) -> None:
        """Clamp the latents after an update: atoms to [-6, 6], log-scales to l0 +- 0.35."""
        with torch.no_grad():
            self.books.clamp_(-ATOM_MAX, ATOM_MAX)
            r = torch.tensor(LOG_SCALE_RANGE, dtype=F32)
            self.logs.copy_(torch.minimum(torch.maximum(self.logs, self.logs0 - r), self.logs0 + r))

    def to(self, device) -> "Latent":
        return Latent(*(t.to(device) for t in (self.books, self.logs, self.idx, self.books0, self.logs0, self.glob)))

    def clone(self) -> "Latent":
        return Latent(*(t.clone() for t in (self.books, self.logs, self.idx, self.books0, self.logs0, self.glob)))


def to_projection(latents: list[Latent], experts: list[int]) -> RVQProjection:
    """The packed-format projection of tuned latents (codes of exactly the values the forward used)."""
    return RVQProjection(
        codebooks=torch.stack([fp4_encode(l.atoms()) for l in latents]),
        indices=torch.stack([l.idx.to(torch.uint8) for l in latents]),
        scales=torch.stack([l.scale_codes() for l in latents]).view(torch.float8_e4m3fn),
        global_scale=latents[0].glob.clone(), experts=tuple(experts))


def atom_grad(gv: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
    """[256, 8]: sum of gv rows [M, 8] per atom id assign [M], exactly (int64 fixed point, order-free)."""
    amax = torch.amax(fixed.finite_or_zero(gv).abs())
    s = fixed.scale_exponent(amax, gv.shape[0])
    q = fixed.to_fixed(gv, s)
    acc = torch.zeros(256, GROUP, dtype=torch.int64, device=gv.device).index_add_(0, assign, q)
    return fixed.from_fixed(acc, s)


class _Decode(torch.autograd.Function):
    """W = (fp4(c0)[a] + fp4(c1)[b]) * (e4m3(exp(l)) * global), straight through both projections."""

    @staticmethod
    def forward(ctx, books, logs, idx, glob):
        sig = exp_(logs)
        codes = e4m3_encode(sig)
        w = decode_parts(fp4_round(books), idx, codes.view(torch.float8_e4m3fn), glob)
        s = e4m3_decode(codes) * glob
        ctx.save_for_backward(books, idx, s, sig, glob)
        return w

    @staticmethod
    def backward(ctx, gw):
        books, idx, s, sig, glob = ctx.saved_tensors
        n, k = gw.shape
        g3 = gw.reshape(n, k // GROUP, GROUP)
        srep = s.repeat_interleave(GROUPS_PER_BLOCK, dim=1).unsqueeze(-1)           # [N, G, 1]
        gv = (g3 * srep).reshape(-1, GROUP)                                          # dL/d(atom sum)
        a, b = idx[..., 0].reshape(-1), idx[..., 1].reshape(-1)
        gbooks = torch.stack([atom_grad(gv, a), atom_grad(gv, b)])
        v = fp4_round(books)
        v = (v[0][idx[..., 0]] + v[1][idx[..., 1]]).reshape(n, k)                    # exact
        # dL/dsigma = global * sum over the block of gw * v; dsigma/dl = exp(l) (straight through e4m3)
        gsig = exact_sum((gw * v).reshape(n, k // SCALE_BLOCK, SCALE_BLOCK), dim=-1) * glob
        return gbooks, gsig * sig, None, None


def decode_latent(lat: Latent, books: torch.Tensor, logs: torch.Tensor) -> torch.Tensor:
    """Differentiable projected weight from (possibly grad-tracking) books/logs with lat's indices."""
    return _Decode.apply(books, logs, lat.idx, lat.glob)


class _Straight(torch.autograd.Function):
    """Forward y = q (the emulated value), backward passes the gradient to x unchanged."""

    @staticmethod
    def forward(ctx, x, q):
        return q

    @staticmethod
    def backward(ctx, g):
        return g, None


def fp4_planes(x: torch.Tensor, planes: int = 4) -> torch.Tensor:
    """x [n, K] as the sum of `planes` FP4 planes, each with a per-row scale amax(residual) / 6."""
    six = torch.tensor(ATOM_MAX, dtype=F32, device=x.device)
    r, out = x, torch.zeros_like(x)
    for _ in range(planes):
        amax = torch.amax(r.abs(), dim=1, keepdim=True)
        sc = torch.where(amax > 0, amax / six, torch.ones_like(amax))   # tensor / tensor: correctly rounded
        q = fp4_round(r / sc) * sc
        out = out + q
        r = r - q
    return out


def fp16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> float16 -> float32 (a cast: round to nearest even, the same everywhere)."""
    return x.to(torch.float16).to(F32)


def expert_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                   steps: tuple[torch.Tensor, torch.Tensor] | None, emulate: bool = False) -> torch.Tensor:
    """A cold expert on its routed rows x [n, D] -> [n, D] (differentiable in w13, w2).

    Default: the donor's own arithmetic with the weights swapped, int8 W8A8 linears with the expert's
    learned activation steps `steps` (training.model.ffn), so unquantized weights give the donor's bits.
    emulate=True: the ARVQ write-up's serving emulation instead (FP4 activation planes, fp32 GEMM, fp16 SwiGLU).
    steps None: a float SwiGLU expert (a Hugging Face donor's), its two GEMMs as BR hp_matmul contractions.
    """
    if steps is None and not emulate:
        return hp_matmul(swiglu(hp_matmul(x, w13.t())), w2.t())
    if not emulate:
        return int8_linear(swiglu(int8_linear(x, w13, steps[0])), w2, steps[1])
    x = _Straight.apply(x, fp4_planes(x.detach()))
    gu = hp_matmul(x, w13.t())
    gu = _Straight.apply(gu, fp16(gu.detach()))  # fp32 GEMM, fp16 boundaries around the SwiGLU
    m = _Straight.apply(swiglu(gu), fp16(swiglu(gu).detach()))
    return hp_matmul(m, w2.t())
