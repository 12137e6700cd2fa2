"""Tile sweep of the loss's row kernel (block, warps), the head's GEMMs (logits and dh, dW), the causal hp
contraction, the hp split, the int8 linear's rotate-quantize passes, its int8 GEMMs, attention's P.V, the
RMSNorm row kernels, the activation quantizer and LSQ passes, the state hash's BLAKE3 loads and AdamW's
program size. Each
variant runs against production's in one run, bits compared (loss, ce, z, dh, dW; attention's output, dq, dk,
dv; the slices, exponents and flags; the codes, steps and flags; the GEMMs' and P.V's outputs) and times as
ratios.

    python benchmarks/ab_tiles.py [--ops loss attention attention-window split rotate-rows rotate-columns
                                   rotate-rebuilt int8-gemm pv rmsnorm activation blake3 adamw]
                                  [--variants TEXT ...] [--out benchmarks/results/ab_tiles.json]
    TRITON_INTERPRET=1 python benchmarks/ab_tiles.py --smoke   # CPU: every variant once at tiny shapes, bits only

Shapes: the open-1b proxy's head (8,192 tokens, d 2048, vocab 128,256), one attention layer (4 windows of
2,048, 16 query / 4 kv heads of 128, causal; and with a window of 512 keys, as the model's local layers) and
the widest int8 linear's backward (w_gate_up, 2048 -> 11264, 8,192 tokens); the int8 GEMMs of one open-1b layer
(its four linears' forward, dx and dw products at 8,192 tokens, with their dequantizing epilogues); attention's
int8 P.V at one layer's shape (4 windows x 4 kv heads, 4 query heads each, T 2,048, D 128); one layer's
RMSNorms (the per-head QK norm of q and k, the pre-norm of 8,192 x 2,048) and its linears' activation codes
and LSQ passes; the state hash's digests of 16 tensors (1 GiB float32, the bf16 embedding, four FFN weights,
eight square ones, two odd sizes: ~2 GiB); AdamW over one layer's weights and the embedding (the restores of
param, m and v from their start are timed with it: the same in every variant).
Times: median of triton.testing.do_bench (CUDA events).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernels.cuda import rotate as cuda_rotate  # noqa: E402
from kernels.digest import bits_equal  # noqa: E402
from kernels.ref import philox  # noqa: E402
from kernels.ref import hadamard as ref_had  # noqa: E402
from kernels.triton import attention as t_att, contraction as hp, loss as t_loss, softmax as t_soft  # noqa: E402
from kernels.triton import int8_linear as t_lin, intmm as t_mm, rmsnorm as t_rms, rotated_mm as t_rot  # noqa: E402
from kernels.triton import adamw as t_adamw, statehash  # noqa: E402

# The split kernels as launched before K, T and lim were specialized (the same Python functions; the band
# split's K-block loop is today's). Measured and removed (docs/perf.md): a split's 32 rows addressed per tile
# where they share a batch, so that a transposed operand's loads run along its contiguous rows, 16 bytes wide
# (attention 0.94-0.96x, the loss 1.00x).
_UNSPECIALIZED = ("splits with K, T and lim unspecialized (the previous launch)", {
    (hp, "_split_stats_kernel"): triton.jit(do_not_specialize=["rows", "K", "RB", "lim", "SEG"])(
        hp._split_stats_kernel.fn),
    (hp, "_split_kernel"): triton.jit(do_not_specialize=["rows", "K", "RB", "lim", "SEG", "NSEG"])(hp._split_kernel.fn),
    (hp, "_band_split_kernel"): triton.jit(do_not_specialize=["rows", "K", "RB", "T", "window"])(
        hp._band_split_kernel.fn)})
# (name, {(module, attribute): value}): what a variant sets on the modules for its run; each list's first
# entry is production (nothing set). All are free choices for the bits.
LOSS_VARIANTS = [("production (rows 2048 x 8 warps; head/dW 128 x 64 x 128, 3 stages)", {})] + [
    (f"rows {blk} x {w} warps", {(t_loss, "ROW_BLOCK"): blk, (t_loss, "ROW_WARPS"): w})
    for blk, w in ((4096, 16), (512, 4))] + [
    (f"{use} {bm} x {bn} x {bk}, {w} warps, {st} stages",
     {(hp, "TILES"): {use: dict(BM=bm, BN=bn, BK=bk, num_warps=w, num_stages=st)}})
    for use, (bm, bn, bk, w, st) in (("head", (128, 64, 64, 8, 4)), ("dw", (64, 64, 128, 4, 2)))] + [
    _UNSPECIALIZED]


def _no_band(t, window):
    """The previous path: causal logits written in full, softmax rows read in full."""
    return False


def _no_band_splits(t, k, window):
    """The previous backward: P^T, dS and dS^T split and multiplied over whole rows."""
    return False


def _global_rows_in_full(t, window):
    """The previous global backward: dP over every tile, dS's rows read in full (windows below T keep the band)."""
    return window is not None and window < t and t_soft.pow2_at_least(window) <= t_soft.MAX_BAND


def _dp_every_tile(a, b, t, window, row_flags):
    """The previous dP of a sliding window: every tile computed and written."""
    return hp.hp_matmul_(a, b, row_flags=row_flags)


_K128 = ("causal", "short")  # attention's logits and dP: one K-step each
ATTENTION_VARIANTS = [("production (logits and dP walk key tiles: 64 x 64, 4 warps, 2 stages)", {}),
                      ("logits and dP a tile per program (the previous launch)", {(hp, "CAUSAL_WALK"): False})] + [
    (f"walk {bm} x {bn}, {w} warps, {st} stages",
     {(hp, "TILES"): {"causal-walk": {"BM": bm, "BN": bn, "num_warps": w, "num_stages": st}}})
    for bm, bn, w, st in ((64, 64, 4, 3), (64, 64, 4, 1), (128, 64, 8, 2), (64, 128, 8, 2))] + [
                      ("K-128 GEMMs a tile per program, 128 x 64, 8 warps, 3 stages",
                       {(hp, "CAUSAL_WALK"): False,
                        (hp, "TILES"): {u: {"BM": 128, "BN": 64, "num_warps": 8, "num_stages": 3} for u in _K128}}),
                      ("K-128 GEMMs a tile per program, 64 x 32, 4 warps, 1 stage",
                       {(hp, "CAUSAL_WALK"): False, (hp, "TILES"): {u: {"BN": 32} for u in _K128}}),
                      ("dP over every tile", {(hp, "hp_window_matmul_"): _dp_every_tile}),
                      ("global dP over every tile, dS rows read in full",
                       {(t_soft, "causal_backward_fits"): _global_rows_in_full}),
                      ("rows read in full, unseen logits stored", {(t_soft, "causal_band_fits"): _no_band}),
                      ("backward splits over whole rows", {(hp, "band_fits"): _no_band_splits}),
                      _UNSPECIALIZED] + [
    (f"softmax rows: forward {f}, backward {b} warps at most",
     {(t_soft, "CAUSAL_FORWARD_WARPS"): f, (t_soft, "CAUSAL_BACKWARD_WARPS"): b})
    for f, b in ((4, 8), (2, 8), (1, 8), (8, 4), (8, 2), (4, 4), (2, 2))] + [
    (f"softmax rows: full rows {w} warps, causal forward 2", {(t_soft, "ROW_WARPS"): w,
                                                              (t_soft, "CAUSAL_FORWARD_WARPS"): 2})
    for w in (4, 16)]
# measured and removed (docs/perf.md): each block rotated twice, in registers or through a program's own
# scratch, instead of once through a row-long one; x_hat and w_hat from the forward's int8 codes;
# for rows contiguous in memory, one row a thread with coalesced loads and the low-to-high stage change
# through a per-program L2 slot (1.1-3.2x slower)
ROTATE_VARIANTS = [("production (rotated once, through a row-long scratch; 4096 elements a program)", {})] + [
    (f"{tile} elements a program", {(t_rot, "TILE"): tile}) for tile in (2048, 8192)]
# the int8 GEMM's tile (BM x BN x BK, warps, stages); integer products: any tile gives the same bits
def _gemm_tile(bm: int, bn: int, bk: int, warps: int, stages: int) -> dict:
    return dict(BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps, num_stages=stages)


GEMM_VARIANTS = [("production (128 x 128 x 64, 4 warps, 5 stages; gated: 128 x 128 x 128, 8 warps, 4)", {})] + [
    (f"{bm} x {bn} x {bk}, {w} warps, {st} stages", {(t_mm, name): _gemm_tile(bm, bn, bk, w, st)
                                                     for name in ("TILE", "MASK_TILE")})
    for bm, bn, bk, w, st in ((128, 128, 128, 8, 4), (128, 256, 128, 8, 3), (256, 128, 128, 8, 3),
                              (128, 256, 128, 8, 4))] + [
    (f"gated (dw) GEMMs only at {bm} x {bn} x {bk}, {w} warps, {st} stages",
     {(t_mm, "MASK_TILE"): _gemm_tile(bm, bn, bk, w, st)})
    for bm, bn, bk, w, st in ((128, 128, 64, 4, 5), (128, 256, 128, 8, 3))]
# P.V's tile: rows, V columns and warps per program (exact int64 sums: any tile gives the same bits)
PV_VARIANTS = [("production (16 rows x 128 columns, 8 warps)", {})] + [
    (f"{bm} rows x {bd} columns, {w} warps", {(t_att, "PV_BM"): bm, (t_att, "PV_BD"): bd, (t_att, "PV_WARPS"): w})
    for bm, bd, w in ((64, 64, 8), (32, 128, 16), (32, 128, 8), (32, 128, 4), (32, 64, 8), (16, 64, 4))]


def _one_row_a_program(d: int) -> tuple[int, int]:
    """The previous RMSNorm row kernels: one row per program, whatever its length."""
    return 1, min(t_rms.pow2_at_least(d), 2048)


RMSNORM_VARIANTS = [("production (1024-element tiles: 8 rows of 128 a program)", {}),
                    ("one row a program (the previous kernels)", {(t_rms, "_row_tile"): _one_row_a_program})] + [
    (f"{n}-element tiles", {(t_rms, "ROW_TILE"): n}) for n in (512, 2048)]
ACTIVATION_VARIANTS = [("production (activation 2 x 512, 4 warps; LSQ 1024 x 1024)", {})] + [
    (f"activation {r} x {k}", {(t_lin, "TILE_R"): r, (t_lin, "TILE_K"): k}) for r, k in ((16, 128), (4, 256), (1, 1024))
] + [(f"LSQ {p} programs of {b}", {(t_lin, "TARGET_PROGRAMS"): p, (t_lin, "LSQ_BLOCK"): b})
     for p, b in ((2048, 1024), (1024, 2048), (4096, 512))]
SPLIT_VARIANTS = [("production (32 x 64, 8 warps)", {})] + [
    (f"{r} x {k}, {w} warps", {(hp, "SPLIT_R"): r, (hp, "SPLIT_K"): k, (hp, "SPLIT_WARPS"): w})
    for r, k, w in ((32, 128, 8), (16, 64, 8), (32, 64, 4), (64, 64, 8), (32, 32, 8))] + [_UNSPECIALIZED]


def _cases(n: int, d: int, v: int, b: int, t: int, dev):
    h = philox.normal(1, 0, (n, d), device=dev).requires_grad_(True)
    w = philox.normal(2, 0, (v, d), std=0.02, device=dev).requires_grad_(True)
    tg = philox.random_bits(3, 0, n, device=dev) % v
    q = philox.normal(4, 0, (b, 16 if d >= 128 else 2, t, min(d, 128)), device=dev).requires_grad_(True)
    k = philox.normal(5, 0, (b, 4 if d >= 128 else 1, t, min(d, 128)), device=dev).requires_grad_(True)
    va = philox.normal(6, 0, tuple(k.shape), device=dev).requires_grad_(True)

    def loss_fb():
        for x in (h, w):
            x.grad = None
        loss, ce, z = t_loss.cross_entropy_zloss(h, w, tg)
        loss.backward()
        return [loss, ce, z, h.grad, w.grad]

    def attention_fb(window=None):
        for x in (q, k, va):
            x.grad = None
        out = t_att.attention(q, k, va, window=window)
        out.backward(torch.ones_like(out))
        return [out, q.grad, k.grad, va.grad]
    chunk = philox.normal(7, 0, (min(n, 1024), v), device=dev)  # one chunk's [tokens, V] logits (or g)
    nb = -(-chunk.shape[0] // 128)

    def split_both():
        # the head's W by rows (for the logits) and a chunk by token blocks (dW's g^T), as the loss cuts them
        cuts = [hp.split(w.detach(), v, d, d, 1),
                hp.split(chunk, nb * v, 128, 1, v, batch_rows=v, s_batch=128 * v, lim=chunk.shape[0])]
        return [t for c in cuts for t in (c.q, c.e, c.bad)]
    return {"loss": ("cross-entropy + z-loss fwd+bwd", loss_fb, LOSS_VARIANTS),
            "attention": ("attention fwd+bwd", attention_fb, ATTENTION_VARIANTS),
            "attention-window": ("attention fwd+bwd, window 512", lambda: attention_fb(min(512, t // 4)),
                                 ATTENTION_VARIANTS),
            "split": ("hp.split (W rows, logits token blocks)", split_both, SPLIT_VARIANTS)}


def _rotate_cases(m: int, k: int, n: int, dev) -> dict:
    """The int8 linear backward's four rotate-quantize passes at its widest shape (x [m, k] -> [m, n]): G's rows
    over N (dx), G's columns over M (dw), and the rebuilt x_hat's and w_hat's columns (from s_x, s_w)."""
    x = philox.normal(11, 0, (m, k), device=dev)
    w = philox.normal(12, 0, (n, k), std=0.02, device=dev)
    g = philox.normal(13, 0, (m, n), device=dev)
    s_x = torch.tensor(0.05, device=dev)
    s_w = t_lin._weight(w, s_x, quant=False)[0]
    hn, hm = ref_had.block_size(n), ref_had.block_size(m)

    def run(*calls):  # the Triton kernel's knobs: its CUDA stand-ins are benchmarks/cuda_rotate.py's to time
        with cuda_rotate.triton_only():
            return [t for args, kw in calls for t in t_rot.rotate_quantize(*args, **kw)]
    pre_cols = [((x, k, m, 1, k), dict(block=hm, pre=s_x)), ((w, k, n, 1, k), dict(block=hn, pre=s_w))]
    g_rows = ((g, m, n, n, 1), dict(block=hn))
    g_cols = ((g, n, m, 1, n), dict(block=hm))
    return {"rotate-rows": ("rotate-quantize G's rows (dx)", lambda: run(g_rows), ROTATE_VARIANTS),
            "rotate-columns": ("rotate-quantize G's columns (dw)", lambda: run(g_cols), ROTATE_VARIANTS),
            "rotate-rebuilt": ("rotate-quantize x_hat's, w_hat's columns", lambda: run(*pre_cols),
                               ROTATE_VARIANTS)}


def _norm_cases(b: int, t: int, heads: int, d: int, dev) -> dict:
    """One layer's RMSNorms, forward and backward: the gain-free per-head QK norm of q [b, heads, t, 128] and
    k [b, heads / 4, t, 128], and the pre-norm of [b t, d] with its gain."""
    q = philox.normal(31, 0, (b, heads, t, 128), std=3.0, device=dev).requires_grad_(True)
    k = philox.normal(32, 0, (b, max(1, heads // 4), t, 128), std=3.0, device=dev).requires_grad_(True)
    x = philox.normal(33, 0, (b * t, d), std=3.0, device=dev).requires_grad_(True)
    w = (1.0 + philox.normal(34, 0, (d,), std=0.1, device=dev)).requires_grad_(True)

    def fb():
        out = []
        for args in ((q,), (k,), (x, w)):
            for a in args:
                a.grad = None
            y = t_rms.rmsnorm(*args)
            y.backward(torch.ones_like(y))
            out += [y] + [a.grad for a in args]
        return out
    return {"rmsnorm": ("RMSNorm fwd+bwd: QK norm, pre-norm", fb, RMSNORM_VARIANTS)}


def _activation_cases(m: int, linears: dict, dev) -> dict:
    """The int8 linears' activation quantizer and LSQ passes at one layer's shapes (x [m, k] for each linear)."""
    xs = [philox.normal(40 + i, 0, (m, k), device=dev) for i, (k, _) in enumerate(linears.values())]
    gs = [philox.normal(50 + i, 0, (m, k), device=dev) for i, (k, _) in enumerate(linears.values())]
    s_x = torch.tensor(0.02, device=dev)

    def run():
        out = []
        for x, g in zip(xs, gs):
            out += list(t_lin._activation(x, s_x)) + list(t_lin._lsq(g, x, s_x, True, True))
        return out
    return {"activation": ("activation codes and LSQ of one layer", run, ACTIVATION_VARIANTS)}


def _pv_cases(bh: int, g: int, t: int, d: int, dev) -> dict:
    """attention's P.V (pv_int8) at one layer's shape: P [B Hkv, G T, T] probabilities-like (uniform in [0, 1)),
    V [B Hkv, T, D], causal, with a window of t / 4 keys (the model's local layers) and without (its global ones)."""
    p = philox.uniform(21, 0, (bh, g * t, t), device=dev)
    v = philox.normal(22, 0, (bh, t, d), device=dev)
    return {"pv": ("P.V, causal, window T/4 and global", lambda: [t_att.pv_int8(p, v, 64, True, t // 4),
                                                                  t_att.pv_int8(p, v, 64, True, None)],
                   PV_VARIANTS)}


LAYER_LINEARS = {"wqkv": (2048, 3072), "wo": (2048, 2048), "w_gate_up": (2048, 11264), "w_down": (5632, 2048)}


def _gemm_cases(m: int, linears: dict, dev) -> dict:
    """The int8 GEMMs of one layer's linears x [m, k] -> [m, n]: forward (contract k), dx (contract n) and dw
    (contract m), each on random codes with its production epilogue (steps, 1/b, non-finite flags, and dw's
    straight-through gate)."""
    def codes(seed, rows, c):
        return ((philox.random_bits(seed, 0, rows * c, device=dev) % 255).to(torch.int32) - 127).to(
            torch.int8).reshape(rows, c)

    def steps(seed, n):
        return philox.uniform(seed, 1, (n,), device=dev) + 0.5
    calls = []
    for i, (k, n) in enumerate(linears.values()):
        for j, (rows, cols, c, inv) in enumerate(((m, n, k, None), (m, k, n, 1 / 256), (n, k, m, 1 / 256))):
            seed = 100 + 10 * i + j
            a, b = codes(seed, rows, c), codes(seed + 1000, cols, c)
            kw = dict(out_dtype=torch.float32, row_scale=steps(seed, rows), col_scale=steps(seed + 1000, cols),
                      inv=inv, bad_rows=torch.zeros(rows, dtype=torch.int32, device=dev),
                      bad_cols=torch.zeros(cols, dtype=torch.int32, device=dev))
            if j == 2:  # dw: the straight-through gate |w / s_w| <= 127 in the epilogue, as int8_linear runs it
                kw.update(mask_src=philox.normal(seed, 2, (rows, cols), std=0.02, device=dev),
                          mask_scale=steps(seed, rows) * 1e-3)
            calls.append((a, b, kw))
    return {"int8-gemm": ("int8 GEMMs of one layer's linears", lambda: [t_mm.gemm(a, b, **kw) for a, b, kw in calls],
                          GEMM_VARIANTS)}


BF16, F32 = torch.bfloat16, torch.float32
# (elements, dtype): 1 GiB float32, the bf16 embedding, four FFN weights, eight square ones, two odd sizes
BLAKE3_SIZES = ([(1 << 28, F32), (128256 * 2048, BF16)] + [(2048 * 11264, BF16)] * 4 + [(2048 * 2048, F32)] * 8
                + [(1_000_003, F32), (77, BF16)])
# (shape, parameter dtype): one open-1b layer's weights, a norm gain and the embedding
ADAMW_SHAPES = [((2048, 11264), BF16), ((5632, 2048), BF16), ((3072, 2048), BF16), ((2048, 2048), BF16),
                ((2048,), BF16), ((128256, 2048), BF16)]


BLAKE3_VARIANTS = [("production (16-byte loads, each block's loaded during the block before, statehash.PREFETCH)", {}),
                   ("16-byte loads when the block comes (no PREFETCH)", {(statehash, "PREFETCH"): False}),
                   ("one [LANES, 16] tile a block, columns through shared memory",
                    {(statehash, "VECTOR_LOADS"): False, (statehash, "PREFETCH"): False})]


def _blake3_cases(sizes: list[tuple[int, torch.dtype]], dev) -> dict:
    """The state hash's digests of a state-like set of tensors (whole and partial last programs)."""
    ts = [philox.normal(900 + i, 0, (n,), device=dev).to(dt) for i, (n, dt) in enumerate(sizes)]
    gib = sum(t.numel() * t.element_size() for t in ts) / 2**30
    return {"blake3": (f"state hash digests ({len(ts)} tensors, {gib:.2f} GiB)",
                       lambda: [statehash.queue_digests(ts)], BLAKE3_VARIANTS)}


ADAMW_VARIANTS = [("production (1024 elements, 8 warps a program)", {})] + [
    (f"{blk} elements, {w} warps a program", {(t_adamw, "BLOCK"): blk, (t_adamw, "WARPS"): w})
    for blk, w in ((1024, 4), (512, 4), (512, 8), (2048, 16), (256, 2))]


def _adam_state(seed: int, shape: tuple[int, ...], dtype: torch.dtype, dev) -> tuple[torch.Tensor, ...]:
    """(param, grad, m, v) of one tensor: moments as after a few steps."""
    def normal(k, std):
        return philox.normal(seed, k, shape, std=std, device=dev)
    return normal(0, 0.02).to(dtype), normal(1, 1e-3), normal(2, 1e-4), normal(3, 1e-4).square()


def _adamw_cases(shapes: list[tuple[tuple[int, ...], torch.dtype]], dev) -> dict:
    """One AdamW step over a layer-like set of tensors, each from the same starting state every call."""
    start = [_adam_state(700 + i, s, dt, dev) for i, (s, dt) in enumerate(shapes)]
    work = [tuple(t.clone() for t in grp) for grp in start]

    def run():
        for (p, g, m, v), (p0, _, m0, v0) in zip(work, start):
            p.copy_(p0), m.copy_(m0), v.copy_(v0)
            t_adamw.adamw_step(p, g, m, v, step=7, lr=3e-4, weight_decay=0.1)
        return [t for p, _, m, v in work for t in (p, m, v)]
    return {"adamw": (f"AdamW step over {len(shapes)} tensors (restores included)", run, ADAMW_VARIANTS)}


def _with(sets: dict, fn):
    """fn() with the variant's module attributes set, restored afterwards."""
    saved = {key: getattr(*key) for key in sets}
    try:
        for (mod, attr), value in sets.items():
            setattr(mod, attr, value)
        return fn()
    finally:
        for (mod, attr), value in saved.items():
            setattr(mod, attr, value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, bits only (TRITON_INTERPRET=1 on a CPU)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ab_tiles.json"))
    ops = ("loss", "attention", "attention-window", "split", "rotate-rows", "rotate-columns", "rotate-rebuilt",
           "int8-gemm", "pv", "rmsnorm", "activation", "blake3", "adamw")
    ap.add_argument("--ops", nargs="+", choices=ops, default=ops, help="which sweeps to run")
    ap.add_argument("--variants", nargs="+", metavar="TEXT",
                    help="run only the variants whose names contain one of these (production always runs)")
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = (300, 40, 77, 1, 40) if args.smoke else (8192, 2048, 128256, 4, 2048)
    rows = []
    cases = {**_cases(*shapes, dev), **_rotate_cases(*((300, 40, 77) if args.smoke else (8192, 2048, 11264)), dev),
             **_gemm_cases(*((300, {"l": (40, 77)}) if args.smoke else (8192, LAYER_LINEARS)), dev),
             **_pv_cases(*((2, 2, 200, 40) if args.smoke else (16, 4, 2048, 128)), dev),
             **_norm_cases(*((1, 37, 4, 40) if args.smoke else (4, 2048, 16, 2048)), dev),
             **_activation_cases(*((300, {"l": (40, 77)}) if args.smoke else (8192, LAYER_LINEARS)), dev),
             **_blake3_cases([(1000, F32), (257, BF16), (70_001, F32)] if args.smoke else BLAKE3_SIZES, dev),
             **_adamw_cases([((300,), BF16), ((7, 33), F32)] if args.smoke else ADAMW_SHAPES, dev)}
    for key, (op, fn, variants) in cases.items():
        if key not in args.ops:
            continue
        want = [x.detach().clone() for x in fn()]
        base_ms = None
        for name, sets in variants:
            if sets and args.variants and not any(text in name for text in args.variants):
                continue
            try:
                same = all(bits_equal(a, b) for a, b in zip(_with(sets, fn), want))
            except Exception as exc:  # e.g. a tile whose pipeline does not fit in shared memory: say so, go on
                if not sets:
                    raise
                print(f"{op:40s} {name:36s} did not run: {type(exc).__name__}: {exc}", flush=True)
                rows.append(dict(op=op, variant=name, error=f"{type(exc).__name__}: {exc}"))
                continue
            ms = None
            if not args.smoke:
                from triton.testing import do_bench
                ms = _with(sets, lambda: do_bench(fn, warmup=2, rep=200, return_mode="median"))
                base_ms = base_ms or ms
            rows.append(dict(op=op, variant=name, sets={f"{m.__name__}.{a}": getattr(v, "__name__", v)
                                                        for (m, a), v in sets.items()},
                             same_bits=same, ms=ms,
                             vs_production=None if ms is None else base_ms / ms))
            print(f"{op:40s} {name:36s} bits {'same' if same else 'DIFFER'}"
                  + ("" if ms is None else f"  {ms:8.3f} ms  {base_ms / ms:.2f}x"), flush=True)
    if not args.smoke:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0 if all(r.get("same_bits", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
