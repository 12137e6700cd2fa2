"""Every Triton twin vs the reference op on CUDA and on this machine's CPU: 0 mismatching bits.

Inputs are fresh for each test run (a random base seed, printed; set TRITON_PARITY_SEED to replay one),
drawn with our own Philox, at several shapes including non-powers of two, forward and backward.
NaN payloads are not part of the contract (the CPU and CUDA references differ there): where both sides
are NaN the element counts as equal; every other element compares raw bits.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
# TRITON_INTERPRET=1 runs the twins on the CPU through Triton's interpreter: a logic check, never GPU evidence
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA")]

from kernels.ref import adamw as r_adamw, elementary as r_el, philox, reduce as r_reduce  # noqa: E402
from kernels.ref.fixed import pow2  # noqa: E402
from kernels.ref import rmsnorm as r_rms, rope as r_rope, softmax as r_soft, swiglu as r_swiglu  # noqa: E402
from kernels.triton import adamw as t_adamw, elementary as t_el, reduce as t_reduce  # noqa: E402
from kernels.triton import rmsnorm as t_rms, rope as t_rope, softmax as t_soft, swiglu as t_swiglu  # noqa: E402
from kernels.ref import hadamard as r_had, int8_linear as r_lin, intmm as r_mm, rotated_mm as r_rot  # noqa: E402
from kernels.triton import hadamard as t_had, int8_linear as t_lin, intmm as t_mm, rotated_mm as t_rot  # noqa: E402
from kernels.ref import contraction as r_hp, embedding as r_emb, loss as r_loss  # noqa: E402
from kernels.triton import contraction as t_hp, embedding as t_emb, loss as t_loss  # noqa: E402
from kernels.ref import attention as r_att  # noqa: E402
from kernels.triton import attention as t_att  # noqa: E402

import kernels  # noqa: E402

TRITON = kernels.backend("triton")
BASE = int(os.environ.get("TRITON_PARITY_SEED", int.from_bytes(os.urandom(6), "little")))
INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
CUDA = torch.device("cpu" if INTERPRET else "cuda")
# shapes too large for the interpreter's few minutes: run on the GPU only
gpu_only = pytest.mark.skipif(INTERPRET, reason="too large for TRITON_INTERPRET")


def setup_module(_):
    print(f"\nTRITON_PARITY_SEED={BASE}")


def seed(*parts) -> int:
    h = BASE
    for p in str(parts).encode():
        h = ((h ^ p) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


# Inputs are drawn on the test's device and handed over on the host: our Philox gives every element the same
# numbers on any device, and on the GPU machine's host a model-sized draw took ~1 minute (the slowest tests).
def random_bits(s: int, stream: int, n: int) -> torch.Tensor:
    return philox.random_bits(s, stream, n, device=CUDA).cpu()


def normal(shape, *tag, std: float = 1.0) -> torch.Tensor:
    return philox.normal(seed(*tag), 0, shape, std=std, device=CUDA).cpu()


def wide(shape, *tag) -> torch.Tensor:
    """Normals times 2^k, k uniform in [-30, 30]: a wide dynamic range for the fixed-point sums."""
    n = 1
    for s in shape:
        n *= s
    k = (random_bits(seed(*tag, "k"), 1, n) % 61 - 30).reshape(shape)
    return normal(shape, *tag) * pow2(k).to(torch.float32)  # exact powers of two


def mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    """Elements whose raw bits differ (both-NaN counts as equal)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    diff = a.view(INTS[a.element_size()]) != b.view(INTS[b.element_size()])
    if a.is_floating_point():
        diff &= ~(torch.isnan(a) & torch.isnan(b))
    return int(diff.sum())  # br-ok: integer count in a test


def assert_same(twin: dict, ref_cuda: dict, ref_cpu: dict | None = None) -> None:
    bad = {f"{k} vs ref cuda": mismatches(twin[k], ref_cuda[k]) for k in twin}
    if ref_cpu is not None:
        bad.update({f"{k} vs ref cpu": mismatches(twin[k], ref_cpu[k]) for k in twin})
    assert all(v == 0 for v in bad.values()), bad


def fwd_bwd(fn, inputs: list[torch.Tensor], g: torch.Tensor, dev) -> dict[str, torch.Tensor]:
    """y = fn(*inputs) on `dev` with gradients for every input; y.backward(g)."""
    xs = [t.to(dev).clone().requires_grad_(True) for t in inputs]
    y = fn(*xs)
    y.backward(g.to(dev))
    out = {"y": y}
    out.update({f"d{i}": x.grad for i, x in enumerate(xs) if x.grad is not None})
    return out


def three_ways(twin_fn, ref_fn, inputs, g, cpu: bool = True) -> None:
    assert_same(fwd_bwd(twin_fn, inputs, g, CUDA), fwd_bwd(ref_fn, inputs, g, CUDA),
                fwd_bwd(ref_fn, inputs, g, "cpu") if cpu else None)


# --- elementwise elementary functions ---

UNARY = ["exp", "sqrt", "rsqrt", "sigmoid", "silu"]
SHAPES = [(1, 1), (7, 33), (64, 1000), (3, 4097), (1000, 1037)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", UNARY)
def test_unary(op, shape):
    x = normal(shape, op, shape, std=4.0)
    if op in ("sqrt", "rsqrt"):
        x = x.abs() + 1e-3
    three_ways(getattr(t_el, op), getattr(r_el, op), [x], normal(shape, op, shape, "g"), cpu=shape[0] < 1000)


@pytest.mark.parametrize("op", UNARY)
def test_unary_every_float32_class(op):
    """2^20 random bit patterns: subnormals, huge values, infinities, NaNs, both signs."""
    bits = random_bits(seed(op, "bits"), 0, 1 << 20)
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)
    x = bits.view(torch.float32)
    specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1.1754942e-38,
                             88.72283, 88.72284, -103.97208, -103.9721, 709.9, -745.5, 3.4028235e38],
                            dtype=torch.float32)
    x = torch.cat([x, specials])
    g = normal(tuple(x.shape), op, "bits-g")
    three_ways(getattr(t_el, op), getattr(r_el, op), [x], g)


# --- exact reductions ---

@pytest.mark.parametrize("shape,dim", [((7, 33), -1), ((64, 1000), 0), ((3, 4097), -1), ((2, 5, 3000), 1),
                                       ((2, 1_000_003), -1), ((1, 1), 0)], ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_sum_mean(op, shape, dim):
    x = wide(shape, op, shape)
    out_shape = list(shape)
    out_shape.pop(dim)
    g = normal(tuple(out_shape), op, shape, "g")
    three_ways(lambda t: getattr(t_reduce, op)(t, dim), lambda t: getattr(r_reduce, op)(t, dim), [x], g)


def test_exact_sum_float64_and_any_split_count():
    x = wide((5, 300_001), "split")
    x64 = x.double() * x.double()
    want = r_reduce.exact_sum(x64.to(CUDA), -1, True, scale=1.0 / 3, out_dtype=torch.float64)
    got = t_reduce.exact_sum(x64.to(CUDA), -1, True, scale=1.0 / 3, out_dtype=torch.float64)
    assert mismatches(got, want) == 0
    ref = r_reduce.exact_sum(x.to(CUDA))
    for s in (1, 2, 7, 64):
        assert mismatches(t_reduce.row_sum(x.to(CUDA), torch.float32, splits=s), ref) == 0, s


def test_sum_nonfinite_rows():
    x = normal((4, 5000), "nonfinite")
    inf, nan = float("inf"), float("nan")
    x[0, 17], x[1, 4000], x[2, 5], x[2, 6], x[3, 9] = inf, -inf, inf, -inf, nan
    assert mismatches(t_reduce.exact_sum(x.to(CUDA)), r_reduce.exact_sum(x.to(CUDA))) == 0


# --- global L2 norm (gradient clipping) and the exact gradient reduction (training/reduction.py) ---

def specials(dtype=torch.float32) -> torch.Tensor:
    """Non-finite, huge, tiny, subnormal and signed-zero values, and ExactSum's edges: 2^24 and 2^-97."""
    inf, nan = float("inf"), float("nan")
    v = [nan, inf, -inf, 3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.1754942e-38, 0.0, -0.0, 2.0 ** 24,
         -2.0 ** 24, 2.0 ** 24 - 1, -(2.0 ** 24 - 1), 2.0 ** -97, -2.0 ** -97, 3 * 2.0 ** -98, -3 * 2.0 ** -98,
         2.0 ** -100, -2.0 ** -100, 2.0 ** -96, 5 * 2.0 ** -97]
    return torch.tensor(v, dtype=torch.float32).to(dtype)


# the elements planted into a list's last non-empty tensor (NaN wins over inf, inf over every finite value)
L2_PLANTS = {"none": [], "finite": [3, 4, 5, 6, 7, 9], "inf": [2, 3, 5], "nan": [0, 1, 2, 7]}
L2_LISTS = [[(1, 1)], [(7, 33), (1000,), (0,), (3, 4097), (5,)], [(0, 3), (257,), (2, 0)], [(0,), (0, 5)]]
L2_LARGE = [(4096, 4096), (50257, 768), (11, 1_000_003), (0,), (3,)]  # model-sized: several splits per tensor


@pytest.mark.parametrize("plant", list(L2_PLANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "mixed"], ids=str)
@pytest.mark.parametrize("shapes", L2_LISTS, ids=lambda s: "+".join("x".join(map(str, t)) for t in s))
def test_global_l2_norm(shapes, dtype, plant):
    check_l2(shapes, dtype, plant)


# the large list once per plant kind that changes the path (finite extremes, NaN), not per dtype x plant:
# its CPU inputs and reference take seconds each
@gpu_only
@pytest.mark.parametrize("dtype,plant", [("mixed", "finite"), (torch.float32, "nan")], ids=str)
def test_global_l2_norm_large(dtype, plant):
    check_l2(L2_LARGE, dtype, plant)


def check_l2(shapes, dtype, plant) -> None:
    ts = [wide(sh, "l2", shapes, i).to(torch.bfloat16 if dtype == "mixed" and i % 2 else
                                      torch.float32 if dtype == "mixed" else dtype) for i, sh in enumerate(shapes)]
    full = [t for t in ts if t.numel()]
    if L2_PLANTS[plant] and full:
        x = full[-1].view(-1)
        v = specials(x.dtype)[L2_PLANTS[plant]][: x.numel()]
        x[: v.numel()] = v
    assert_same({"y": t_reduce.global_l2_norm([t.to(CUDA) for t in ts])},
                {"y": r_reduce.global_l2_norm([t.to(CUDA) for t in ts])}, {"y": r_reduce.global_l2_norm(ts)})


def test_global_l2_norm_reads_each_calls_values_and_strided_views():
    """One launch reads every tensor through a table of addresses: calls on the same tensors, changed in place
    between them (as each step's gradients recur at the same addresses), read the new values; a strided view
    is read through its contiguous copy."""
    ts = [wide(sh, "l2-kept", i).to(CUDA) for i, sh in enumerate([(300, 7), (4097,), (5, 3)])]
    ts.append(wide((64, 40), "l2-kept", 3).to(CUDA).t())  # not contiguous
    for scale in (1.0, 2.0 ** 40, 0.0):
        for t in ts[:3]:
            t.mul_(scale)
        assert_same({"y": t_reduce.global_l2_norm(ts)}, {"y": r_reduce.global_l2_norm(ts)},
                    {"y": r_reduce.global_l2_norm([t.cpu() for t in ts])})


def test_global_l2_norm_empty_list_raises():
    with pytest.raises(ValueError, match="empty"):
        t_reduce.global_l2_norm([])


def xsum_partials(shape, k, *tag) -> list[torch.Tensor]:
    """k partial gradients in ExactSum's range (|g| mostly 2^-40 .. 2^22), the specials planted in the first
    and negated in the second (inf - inf, exact cancellation, ties of the grid rounding)."""
    parts = [wide(shape, "xsum", shape, *tag, i) * 2.0 ** -10 for i in range(k)]
    sp = specials()
    if parts[0].numel() >= sp.numel():
        parts[0].view(-1)[: sp.numel()] = sp
        if k > 1:
            parts[1].view(-1)[: sp.numel()] = -sp
    return parts


def xsum_state(s, scale: float) -> dict[str, torch.Tensor]:
    """An accumulator's result, then (after shared(), which flushes a pending partial) its limbs, bad, result."""
    out = {"y": s.result(scale)}
    limbs, bad = s.shared()
    out.update({"limbs": limbs.clone(), "bad": bad.clone(), "y_shared": s.result(scale)})
    return out


XSUM_SHAPES = [(1, 1), (7, 33), (1000,), (3, 4097), (0, 4)]


@pytest.mark.parametrize("scale", [1.0, 1.0 / 3, 1.0 / 12], ids=str)
@pytest.mark.parametrize("k", [1, 3, 4, 5, 9])  # 4 and more: the fused pass over several pending partials
@pytest.mark.parametrize("shape", XSUM_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_exact_sum_fused(shape, k, scale):
    check_exact_sum(shape, k, scale)


@gpu_only
@pytest.mark.parametrize("k,scale", [(1, 1.0), (3, 1.0 / 12)], ids=str)
def test_exact_sum_fused_large(k, scale):
    """A model-sized gradient (the FFN's), the pending and the limbs paths once each (CPU inputs take seconds)."""
    check_exact_sum((4096, 11264), k, scale)


def check_exact_sum(shape, k, scale) -> None:
    from training.reduction import ExactSum

    parts = xsum_partials(shape, k, k)

    def run(dev, ops):
        s = ExactSum(shape, dev, ops)
        assert (s._fused is not None) == (ops is not None)
        for p in parts:
            s.add(p.to(dev))
        return xsum_state(s, scale)

    assert_same(run(CUDA, TRITON), run(CUDA, None), run("cpu", None))


@pytest.mark.parametrize("shape", [(7, 33), (3, 4097), pytest.param((4096, 11264), marks=gpu_only)],
                         ids=lambda s: "x".join(map(str, s)))
def test_exact_sum_fused_merge_and_of_shared(shape):
    from training.reduction import ExactSum

    parts = xsum_partials(shape, 6, "merge")

    def run(dev, ops):
        a, b, c = (ExactSum(shape, dev, ops) for _ in range(3))
        for p in parts[:2]:
            a.add(p.to(dev))
        b.add(parts[2].to(dev))  # pending: flushed by the merge
        for p in parts[3:]:
            c.add(p.to(dev))
        b.merge(c)
        a.merge(b)
        out = {"merged_" + k: v for k, v in xsum_state(a, 1.0 / 6).items()}
        limbs, bad = a.shared()
        t = ExactSum.of_shared(limbs.clone(), bad.clone(), ops)
        t.add(parts[0].to(dev))  # an accumulator over given buffers takes further partials in place
        out.update({"of_shared_" + k: v for k, v in xsum_state(t, 1.0 / 7).items()})
        return out

    assert_same(run(CUDA, TRITON), run(CUDA, None), run("cpu", None))


def test_exact_sum_fused_result_of_unnormalized_limbs():
    """Crafted sums: float32 ties (and ties -+1 grid unit) at every magnitude 2^0 .. 2^94 of the grid, both signs,
    held in digits as many partials leave them (a negative low digit, carries up to 2^61). The carry
    normalization and the fixed float64 chain decide these roundings (double rounding included)."""
    from training.reduction import ExactSum

    vals = [sg * ((((1 << 24) + 1) << t) + d) for t in range(95) for d in (-1, 0, 1) for sg in (1, -1)]
    n = len(vals)
    a = (philox.random_bits(seed("limbs", "a"), 0, n) % (1 << 22)).tolist()
    b = (philox.random_bits(seed("limbs", "b"), 0, n) % (1 << 22)).tolist()
    rows = []
    for v, ai, bi in zip(vals, a, b):
        ai, bi = ai - (1 << 21), bi - (1 << 21)
        n0, n1, n2 = v & ((1 << 40) - 1), (v >> 40) & ((1 << 40) - 1), v >> 80
        rows.append([n0 + (ai << 40), n1 - ai + (bi << 40), n2 - bi])  # the same integer, un-normalized
    limbs = torch.tensor(rows, dtype=torch.int64).T.contiguous()
    bad = torch.zeros(n, dtype=torch.float64)
    bad[::97] = float("inf")

    def run(dev, ops):
        return {f"y{i}": ExactSum.of_shared(limbs.to(dev), bad.to(dev), ops).result(sc)
                for i, sc in enumerate((1.0, 1.0 / 3, 2.0 ** 40))}

    assert_same(run(CUDA, TRITON), run(CUDA, None), run("cpu", None))


def test_reduce_gradients_exact_fused():
    from training.config import Topology
    from training.reduction import mesh_order, reduce_gradients

    topo, accum = Topology(2, 1), 2
    shapes = {"w": (7, 33), "b": (257,), "e": (0, 4), "s": (1,)}
    parts = {k: xsum_partials(sh, topo.world * accum, "rg", k) for k, sh in shapes.items()}

    def run(dev, ops):
        ps = ((c, {k: p[i].to(dev) for k, p in parts.items()}) for i, c in enumerate(mesh_order(topo, accum)))
        return reduce_gradients(ps, topo, mesh_order(topo, accum), "exact", ops=ops)

    assert_same(run(CUDA, TRITON), run(CUDA, None), run("cpu", None))


# --- layer ops ---

@pytest.mark.parametrize("shape,gain", [((7, 33), True), ((3, 5, 100), True), ((13, 384), True), ((1, 1), False),
                                        ((2, 4, 7, 8), False), ((2, 7, 128), False), ((512, 2048), True),
                                        ((5, 4100), True), ((3000, 96), True)], ids=str)
def test_rmsnorm(shape, gain):
    x = normal(shape, "rms", shape, std=3.0)
    g = normal(shape, "rms", shape, "g")
    if gain:
        w = 1.0 + normal(shape[-1:], "rms", shape, "w", std=0.1)
        three_ways(t_rms.rmsnorm, r_rms.rmsnorm, [x, w], g, cpu=shape[0] < 512)
    else:
        three_ways(t_rms.rmsnorm, r_rms.rmsnorm, [x], g)


@pytest.mark.parametrize("gain", [False, True], ids=["gainfree", "gain"])
def test_rmsnorm_short_rows_share_a_program(gain):
    """Rows of 128 (the per-head QK norm), 16 to a program with a partial last one: a non-finite or zero row
    among finite ones keeps its own result, and its neighbours theirs."""
    x = normal((3, 37, 128), "rms-rows", std=3.0)
    x[0, 5, 7] = float("nan")
    x[1, 2, :] = float("inf")
    x[2, 36, 0] = -float("inf")
    x[1, 9] = 0.0
    g = normal((3, 37, 128), "rms-rows", "g")
    g[2, 3, 4] = float("nan")
    g[0, 20, :] = float("inf")
    if gain:
        w = 1.0 + normal((128,), "rms-rows", "w", std=0.1)
        three_ways(t_rms.rmsnorm, r_rms.rmsnorm, [x, w], g)
    else:
        three_ways(t_rms.rmsnorm, r_rms.rmsnorm, [x], g)


def test_rmsnorm_dweight_any_split_count():
    x, g = normal((1000, 257), "dw"), normal((1000, 257), "dw", "g")
    _, rstd = t_rms._forward(x.to(CUDA), None, 1e-6)
    one = t_rms._dw(g.to(CUDA), x.to(CUDA), rstd, splits=1)
    for s in (2, 5, 31):
        assert mismatches(t_rms._dw(g.to(CUDA), x.to(CUDA), rstd, splits=s), one) == 0, s


@pytest.mark.parametrize("shape", [(1, 2), (7, 66), (3, 5, 200), (13, 768), (1024, 11264)], ids=str)
def test_swiglu(shape):
    x = normal(shape, "swiglu", shape, std=3.0)
    g = normal((*shape[:-1], shape[-1] // 2), "swiglu", shape, "g")
    three_ways(t_swiglu.swiglu, r_swiglu.swiglu, [x], g, cpu=shape[0] < 1024)


@pytest.mark.parametrize("shape", [(1, 2, 7, 8), (2, 3, 33, 64), (1, 1, 130, 128), (2, 16, 1000, 128),
                                   (3, 5, 17, 6)], ids=str)
def test_rope(shape):
    t, d = shape[-2], shape[-1]
    cos, sin = r_rope.rope_tables(t, d, device=CUDA)
    x, g = normal(shape, "rope", shape), normal(shape, "rope", shape, "g")
    twin = fwd_bwd(lambda a: t_rope.apply_rope(a, cos, sin), [x], g, CUDA)
    ref = fwd_bwd(lambda a: r_rope.apply_rope(a, cos, sin), [x], g, CUDA)
    cpu = fwd_bwd(lambda a: r_rope.apply_rope(a, cos.cpu(), sin.cpu()), [x], g, "cpu")
    assert_same(twin, ref, cpu)


@pytest.mark.parametrize("shape,dim", [((7, 33), -1), ((3, 5, 100), 1), ((4, 3000), -1), ((8, 16, 257), -1),
                                       ((4096, 1024), -1)], ids=str)
def test_softmax(shape, dim):
    x = normal(shape, "softmax", shape, std=4.0)
    x.view(-1)[:: 13] = -float("inf")  # masked logits
    x.view(-1)[5] = float("nan")  # a NaN row
    if dim == -1:
        x[..., 1, :] = -float("inf")  # wholly masked rows
    g = normal(shape, "softmax", shape, "g")
    three_ways(lambda t: t_soft.softmax(t, dim), lambda t: r_soft.softmax(t, dim), [x], g, cpu=shape[0] < 4096)


@pytest.mark.parametrize("heads,t,window", [(3, 20, None), (2, 33, 5), (2, 200, 40), (1, 70, 64), (1, 100, 300),
                                             pytest.param(4, 2048, 512, marks=gpu_only),
                                             pytest.param(2, 2048, 100, marks=gpu_only)], ids=str)
def test_softmax_causal_reads_seen_keys_only(heads, t, window):
    """Attention's causal rows: the reference's softmax_ of the masked logits, with NaN where the twin must not
    read (the unseen entries, which _logits leaves unwritten); rows with a NaN, a +inf, a -inf and all -inf
    among their seen keys."""
    x = normal((heads * t, t), "sm-causal", t, window, std=4.0)
    allowed = r_att.allowed_keys(t, True, window).repeat(heads, 1)
    x[3, 0] = float("nan")
    x[t - 1, t - 1] = float("inf")
    x[5, 5] = -float("inf")
    x[heads * t // 2 + 1, :] = -float("inf")  # every seen key of this row is -inf: max -inf, the unseen e NaN
    masked = torch.where(allowed, x, torch.full_like(x, -float("inf")))
    unread = torch.where(allowed, x, torch.full_like(x, float("nan")))
    twin = t_soft.softmax_causal_(unread.to(CUDA), window) if t_soft.causal_band_fits(t, window) else \
        t_soft.softmax_causal_(masked.to(CUDA), window)
    assert mismatches(twin, r_soft.softmax_(masked.to(CUDA), -1)) == 0
    assert mismatches(twin, r_soft.softmax_(masked, -1)) == 0


@pytest.mark.parametrize("heads,t,window", [(2, 33, 5), (2, 200, 40), (1, 70, 64), (2, 33, 33), (2, 200, 256),
                                             pytest.param(4, 2048, 512, marks=gpu_only),
                                             pytest.param(2, 2048, 2048, marks=gpu_only)], ids=str)
def test_softmax_causal_backward_reads_the_window(heads, t, window):
    """dS of a sliding-window row from its window alone (a window of T or more: a global layer's causal row,
    keys 0..i): the reference's bits, but for the sign of the zeros outside the window (what the hp splits of
    dS cannot see); rows whose g holds a non-finite entry (flagged) are read in full and match to the bit.
    y has a NaN row (a NaN logit); g a NaN, a +inf outside the window and a -inf inside, and NaN outside the
    windows of its unflagged rows (what the kernel must not read)."""
    x = normal((heads * t, t), "smb-causal", t, window, std=4.0)
    allowed = r_att.allowed_keys(t, True, window).repeat(heads, 1)
    x[1, 0] = float("nan")
    y = r_soft.softmax_(torch.where(allowed, x, torch.full_like(x, -float("inf"))), -1)
    g = normal((heads * t, t), "smb-causal", t, window, "g")
    g[4, 2] = float("nan")
    g[t - 1, 0] = float("inf")  # outside row t-1's window: the reference's dS row is NaN
    g[7, 7] = -float("inf")
    flags = (~torch.isfinite(g)).any(-1).to(torch.int32)
    # outside the windows of unflagged rows g may be unwritten (contraction.hp_window_matmul_): NaN there
    unread = torch.where(allowed | (flags != 0)[:, None], g, torch.full_like(g, float("nan")))
    twin = t_soft.softmax_causal_backward(y.to(CUDA), unread.to(CUDA), window, flags.to(CUDA)).cpu()
    want = r_soft.softmax_backward(y, g, -1)
    assert mismatches(twin[allowed], want[allowed]) == 0
    assert mismatches(twin + 0.0, want + 0.0) == 0  # -0 + 0 = +0: outside the window only the zeros' sign may differ
    assert mismatches(twin[flags != 0], want[flags != 0]) == 0
    ref_cuda = r_soft.softmax_backward(y.to(CUDA), g.to(CUDA), -1).cpu()
    assert mismatches(twin + 0.0, ref_cuda + 0.0) == 0


# Triton 3.6's interpreter casts float32 -> bfloat16 by truncation (1 + 2^-8 + 2^-10 -> 1.0; torch and the GPU's
# cvt.rn give 1 + 2^-7): the bfloat16 masters can only be checked on a GPU
bf16_on_gpu = pytest.mark.skipif(INTERPRET, reason="TRITON_INTERPRET truncates float32 -> bfloat16")


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=bf16_on_gpu)], ids=str)
@pytest.mark.parametrize("shape,t0,wd", [((100,), 1, 0.0), ((7, 33), 1, 0.1), ((13, 384), 998, 0.1),
                                         ((1000, 1037), 5, 0.1)], ids=str)
def test_adamw(shape, t0, wd, dtype):
    p0 = normal(shape, "adamw", shape, std=0.02).to(dtype)
    gs = [normal(shape, "adamw", shape, k, std=0.01).to(dtype) for k in range(3)]
    gs[1].view(-1)[::7] = 0  # zero gradients: tiny and subnormal moments

    def run(step_fn, dev):
        p = p0.to(dev).clone()
        m = torch.zeros(shape, device=dev)
        v = torch.zeros(shape, device=dev)
        out = {}
        for k, g in enumerate(gs):
            step_fn(p, g.to(dev), m, v, step=t0 + k, lr=4.5e-4, weight_decay=wd)
            out.update({f"p{k}": p.clone(), f"m{k}": m.clone(), f"v{k}": v.clone()})
        return out

    assert_same(run(t_adamw.adamw_step, CUDA), run(r_adamw.adamw_step, CUDA), run(r_adamw.adamw_step, "cpu"))


def test_adamw_device_scalars_are_cached_by_their_bits():
    """The twin caches its scalars on the device by the doubles' bits: weight decay -0.0 and 0.0 stay distinct
    (they round a -0.0 parameter differently), each step as the reference's."""
    p0 = torch.tensor([-0.0, 0.0, 1.0, -2.0])
    g = torch.tensor([0.0, -0.0, 0.5, 0.25])
    for wd in (0.0, -0.0, 0.0, -0.0):
        outs = []
        for fn in (t_adamw.adamw_step, r_adamw.adamw_step):
            p, m, v = p0.to(CUDA).clone(), torch.zeros(4, device=CUDA), torch.zeros(4, device=CUDA)
            fn(p, g.to(CUDA), m, v, step=1, lr=1e-3, weight_decay=wd)
            outs.append(p)
        assert mismatches(outs[0], outs[1]) == 0, wd


def test_backend_namespace_runs_the_twins():
    import kernels

    b = kernels.backend("triton")
    assert b.rmsnorm.rmsnorm is t_rms.rmsnorm and b.reduce.dot is r_reduce.dot
    x = normal((9, 70), "ns").to(CUDA)
    assert mismatches(b.softmax.softmax(x), r_soft.softmax(x)) == 0


# --- int8 GEMMs, Hadamard rotation, the int8 QAT linear ---

def int8s(shape, *tag) -> torch.Tensor:
    """Uniform int8 in [-128, 127] (-128 included: the GEMM must be exact for every code)."""
    n = 1
    for s in shape:
        n *= s
    return (random_bits(seed(*tag), 0, n) % 256 - 128).to(torch.int8).reshape(shape)


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (130, 200, 65), (64, 16, 128),
                                   pytest.param(1000, 4096, 2000, marks=gpu_only)], ids=str)
def test_int8_mm(m, k, n):
    a, b = int8s((m, k), "mm", m, k), int8s((k, n), "mm", k, n)
    want = r_mm.int8_mm(a, b)
    for bb in (b, b.t().contiguous().t()):  # row-major and column-major B
        assert torch.equal(t_mm.int8_mm(a.to(CUDA), bb.to(CUDA)).cpu(), want)


def test_int8_bmm():
    a, b = int8s((2, 3, 17, 40), "bmm"), int8s((2, 3, 40, 9), "bmm", "b")
    assert torch.equal(t_mm.int8_bmm(a.to(CUDA), b.to(CUDA)).cpu(), r_mm.int8_bmm(a, b))


@pytest.mark.parametrize("case", ["fwht 1024", "fwht 2048 (two passes)", "fwht dim 0", "fwht 1", "block dim 1",
                                  "block dim 0", "block 8 padded", "block 2048 float64", "block middle dim"])
def test_hadamard(case):
    x = wide((5, 3000), "had", case)
    x[0, :7], x[1, :5] = 0.0, -0.0  # signed zeros: a + b and a - b must keep the reference's signs
    fn = {"fwht 1024": lambda m, t: m.fwht(t[:, :1024]),
          "fwht 2048 (two passes)": lambda m, t: m.fwht(t[:, :2048], 1),
          "fwht dim 0": lambda m, t: m.fwht(t[:4, :100].double(), 0),
          "fwht 1": lambda m, t: m.fwht(t[:3, :1]),
          "block dim 1": lambda m, t: m.block_hadamard(t, 1),
          "block dim 0": lambda m, t: m.block_hadamard(t, 0),
          "block 8 padded": lambda m, t: m.block_hadamard(t[:, :100], 1, 8),
          "block 2048 float64": lambda m, t: m.block_hadamard(t.double(), 1, 2048),
          "block middle dim": lambda m, t: m.block_hadamard(t.reshape(5, 30, 100), 1, 16)}[case]
    assert mismatches(fn(t_had, x.to(CUDA)), fn(r_had, x.to(CUDA))) == 0
    assert mismatches(fn(t_had, x.to(CUDA)), fn(r_had, x)) == 0


@pytest.mark.parametrize("r,c,s,rotate,block", [(7, 33, 5, True, 256), (40, 300, 70, True, 256),
                                                (40, 300, 70, False, 256), (3, 1, 4, True, 256),
                                                (20, 100, 9, True, 16), (17, 2048, 3, True, 1024),
                                                pytest.param(1024, 5632, 2048, True, 256, marks=gpu_only)], ids=str)
def test_rotated_int8_mm(r, c, s, rotate, block):
    a, b = normal((r, c), "rot", r, c), normal((c, s), "rot", c, s, "b")
    a[:, ::7] *= 100.0  # outliers: the rotation's reason to exist
    if r > 10:
        a[3, 5], b[7, 2] = float("inf"), float("nan")  # a NaN row and a NaN column
    want = r_rot.rotated_int8_mm(a.to(CUDA), b.to(CUDA), rotate=rotate, block=block)
    assert mismatches(want, r_rot.rotated_int8_mm(a, b, rotate=rotate, block=block)) == 0
    for aa, bb in ((a, b), (a.t().contiguous().t(), b.t().contiguous().t())):  # strided operands
        assert mismatches(t_rot.rotated_int8_mm(aa.to(CUDA), bb.to(CUDA), rotate=rotate, block=block), want) == 0


@pytest.mark.parametrize("block", [16, 256])
def test_rotated_int8_mm_rotation_overflow(block):
    """Finite operands whose rotation overflows: four values of 3e38 in one block give inf in the first stage and
    inf - inf = NaN in the next, so the reference's amax of that row (a's row 4, b's column 6) is NaN and its
    step 1, while a GPU max drops a NaN; other rows stay as they were. Both layouts of each operand."""
    a, b = normal((20, 300), "rot-of", block), normal((300, 9), "rot-of", block, "b")
    a[4, 32:36] = 3e38
    b[64:68, 6] = -3e38
    a[7, 40:42] = 3e38  # overflows to +-inf only: an amax of inf, a step of inf
    want = r_rot.rotated_int8_mm(a, b, rotate=True, block=block)
    assert bool(torch.isfinite(want[4]).all())  # finite inputs: no row is flagged bad, the codes carry it
    for aa, bb in ((a, b), (a.t().contiguous().t(), b.t().contiguous().t())):
        assert mismatches(t_rot.rotated_int8_mm(aa.to(CUDA), bb.to(CUDA), rotate=True, block=block), want) == 0


@pytest.mark.parametrize("shape,n,wdtype,rotate", [((1, 8), 16, torch.float32, True),
                                                   ((2, 3, 33), 20, torch.float32, True),
                                                   ((96, 160), 200, torch.float32, False),
                                                   ((50, 100), 70, torch.bfloat16, True),
                                                   ((37, 300), 45, torch.float32, True),
                                                   pytest.param((4, 512, 2048), 5632, torch.bfloat16, True,
                                                                marks=gpu_only),
                                                   pytest.param((1024, 512), 1408, torch.float32, False,
                                                                marks=gpu_only)], ids=str)
def test_int8_linear(shape, n, wdtype, rotate):
    k = shape[-1]
    x = normal(shape, "lin", shape, n)
    w = normal((n, k), "lin", shape, n, "w", std=0.02).to(wdtype)
    g = normal((*shape[:-1], n), "lin", shape, n, "g")
    g[..., :: max(1, n // 7)] *= 100.0  # heavy-tailed columns, as real gradients have
    x.view(-1)[:: 11] *= 8.0            # some |x / s_x| beyond 127: the straight-through gate closes there
    s_x = torch.tensor(0.03)
    three_ways(lambda a, b, c: t_lin.int8_linear(a, b, c, rotate=rotate),
               lambda a, b, c: r_lin.int8_linear(a, b, c, rotate=rotate), [x, w, s_x], g)


def test_int8_linear_nonfinite_and_zero_rows():
    x, w, g = normal((9, 40), "lin-nf"), normal((12, 40), "lin-nf", "w", std=0.02), normal((9, 12), "lin-nf", "g")
    x[2, 3], w[5, 1] = float("nan"), float("inf")  # a NaN output row and column
    w[7] = 0.0                                      # an all-zero row: step 1, codes 0
    three_ways(t_lin.int8_linear, r_lin.int8_linear, [x, w, torch.tensor(0.05)], g)
    assert mismatches(t_lin.weight_step(w.to(CUDA)), r_lin.weight_step(w)) == 0


@pytest.mark.parametrize("rotate", [True, False])
def test_int8_linear_backward_alone(rotate):
    """int8_linear_backward called alone, as kernels/accuracy.py does, with a NaN in x, an inf in w and some
    |x / s_x| beyond 127: the reference's dx, dw and ds_x bits."""
    x, w, g = normal((37, 300), "lin-bw"), normal((45, 300), "lin-bw", "w", std=0.02), normal((37, 45), "lin-bw", "g")
    x[1, 2], w[3, 7] = float("nan"), float("inf")
    x.view(-1)[:: 13] *= 8.0
    s_x = torch.tensor(0.03)
    want = r_lin.int8_linear_backward(g, x, w, s_x, rotate=rotate)
    got = t_lin.int8_linear_backward(g.to(CUDA), x.to(CUDA), w.to(CUDA), s_x.to(CUDA), rotate=rotate)
    assert [mismatches(a, b) for a, b in zip(got, want)] == [0, 0, 0]


@pytest.mark.parametrize("rotate", [True, False])
def test_int8_linear_backward_windows(rotate):
    """The batched backward of 3 windows of 64 tokens (training/windows.py), a NaN in x and clipped activations:
    dx over the batch, dw and ds_x per window, the reference's bits."""
    x, w, g = normal((3, 64, 300), "lin-win"), normal((45, 300), "lin-win", "w", std=0.02), \
        normal((3, 64, 45), "lin-win", "g")
    x[1, 2, 5] = float("nan")
    x.view(-1)[:: 13] *= 8.0
    s_x = torch.tensor(0.03)
    dx, dws, dss = r_lin.int8_linear_backward_windows(g, x, w, s_x, rotate=rotate)
    tx, tws, tss = t_lin.int8_linear_backward_windows(g.to(CUDA), x.to(CUDA), w.to(CUDA), s_x.to(CUDA),
                                                      rotate=rotate)
    assert [mismatches(a, b) for a, b in zip([tx, *tws, *tss], [dx, *dws, *dss])] == [0] * 7


# --- embedding: gather forward, exact int64 scatter-add backward ---

@pytest.mark.parametrize("shape,v,d,dtype,ids_dtype", [((3, 7), 11, 33, torch.float32, torch.int64),
                                                       ((40,), 50, 300, torch.bfloat16, torch.int32),
                                                       ((2, 64), 3, 130, torch.float32, torch.int64),
                                                       pytest.param((4, 2048), 32000, 1024, torch.bfloat16,
                                                                    torch.int64, marks=gpu_only)], ids=str)
def test_embedding(shape, v, d, dtype, ids_dtype):
    n = 1
    for s in shape:
        n *= s
    ids = (random_bits(seed("emb", shape), 0, n) % v).reshape(shape).to(ids_dtype)
    ids.view(-1)[: n // 4] = ids.view(-1)[0]  # one hot row: many addends (and atomics) on the same entries
    w = normal((v, d), "emb", shape).to(dtype)
    g = wide((*shape, d), "emb", shape, "g").to(dtype)

    def run(fn, dev):
        ww = w.to(dev).clone().requires_grad_(True)
        y = fn(ids.to(dev), ww)
        y.backward(g.to(dev))
        return {"y": y, "dw": ww.grad}

    assert_same(run(t_emb.embedding, CUDA), run(r_emb.embedding, CUDA), run(r_emb.embedding, "cpu"))


def test_embedding_grad_nonfinite():
    ids = torch.tensor([[0, 0, 1, 2], [3, 3, 2, 4]])
    g = normal((2, 4, 9), "emb-nf")
    g[0, 0, 3], g[0, 1, 3] = float("inf"), -float("inf")  # +inf + -inf in one entry: NaN
    g[0, 2, 5], g[1, 0, 6], g[1, 1, 6] = float("nan"), float("inf"), float("inf")
    want = r_emb.embedding_grad(ids, g, 6)
    assert mismatches(t_emb.embedding_grad(ids.to(CUDA), g.to(CUDA), 6), want) == 0


@pytest.mark.skipif(INTERPRET, reason="torch's sync debug mode watches CUDA streams")
@pytest.mark.parametrize("nonfinite", [False, True])
def test_embedding_grad_queues_without_waiting_for_the_gpu(nonfinite):
    """The backward runs at the end of the step's backward pass: a host wait there idles the GPU while the host
    queues what follows (docs/perf.md), so whether there is a non-finite element is read on the device."""
    ids = (random_bits(seed("emb-sync"), 0, 256) % 50).to(CUDA)
    g = normal((256, 40), "emb-sync").to(CUDA)
    if nonfinite:
        g[3, 7] = float("inf")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host wait on the GPU raises
    try:
        got = t_emb.embedding_grad(ids, g, 50)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert mismatches(got, r_emb.embedding_grad(ids.cpu(), g.cpu(), 50)) == 0


# --- the int8-sliced high-precision matmul, and the fused cross-entropy + z-loss built on it ---

@pytest.mark.parametrize("sa,sb,slices", [((7, 33), (33, 5), 3), ((70, 130), (130, 90), 3),
                                          ((2, 3, 17, 40), (2, 3, 40, 9), 3), ((20, 50), (50, 30), 1),
                                          ((20, 50), (50, 30), 2), ((20, 50), (50, 30), 4), ((1, 1), (1, 1), 3),
                                          pytest.param((2, 70000), (70000, 3), 3, marks=gpu_only),
                                          pytest.param((4096, 2048), (2048, 2048), 3, marks=gpu_only)], ids=str)
def test_hp_matmul(sa, sb, slices):
    a, b = wide(sa, "hp", sa, sb), normal(sb, "hp", sa, sb, "b")
    if sa[-2] > 10:
        a[..., 3, 4], b[..., 2, 5], a[..., 5, :] = float("nan"), float("inf"), 0.0  # NaN row, NaN column, zeros
    g = normal((*sa[:-1], sb[-1]), "hp", sa, sb, "g")
    three_ways(lambda x, y: t_hp.hp_matmul(x, y, slices), lambda x, y: r_hp.hp_matmul(x, y, slices), [a, b], g,
               cpu=sa[-2] < 4096)
    bt = b.transpose(-1, -2).contiguous().transpose(-1, -2)  # a column-major operand
    assert mismatches(t_hp.hp_matmul_(a.to(CUDA), bt.to(CUDA), slices), r_hp.hp_matmul_(a, b, slices)) == 0


@pytest.mark.parametrize("k", [40, 48, 1000], ids=str)
def test_split_is_the_reference(k):
    """hp.split (operand_rows) gives ref.split_rows' slices and exponents, and flags the rows holding a NaN or an
    infinity, for a transposed operand (rows contiguous in memory, K strided: attention's P^T and dS^T, the
    head's dW operands) and a row-major one, three batches, K a multiple of 16 (K and lim specialized: wide
    loads) or not, and K cut into segments (1000: few rows, so _split_stats_kernel runs first)."""
    xt = wide((3, k, 64), "split", k)  # transposed: 64 rows (its columns) a batch, K = k
    xr = wide((3, 64, k), "split", k, "r")
    for x in (xt, xr):
        x[0, 5, 7], x[1, 2, 30], x[2, 9, 3] = float("nan"), float("inf"), -float("inf")
        x[2, :, 33] = 0.0
        x[2, 33, :] = 0.0
    for x, transpose in ((xt, True), (xr, False)):
        rows = x.transpose(-1, -2) if transpose else x
        want_q, want_e = r_hp.split_rows(rows, 3)
        got = t_hp.operand_rows(x.to(CUDA), 3, transpose)
        for i in range(3):
            assert mismatches(got.q[i, :, :k], want_q[i].reshape(-1, k)) == 0, (transpose, i)
        assert torch.equal(got.e.cpu(), want_e.reshape(-1)), transpose
        assert torch.equal(got.bad.cpu() != 0, (~torch.isfinite(rows)).any(-1).reshape(-1)), transpose


@pytest.mark.parametrize("kind", ["keys", "queries"])
def test_band_split_product(kind):
    """hp_band_matmul_ (band_split: K and T specialized, K ranges stepped as blocks) gives the reference's
    product for a banded P^T dO (key rows) or dS K (query rows), with a NaN and an infinity inside the band."""
    bsz, g, t, d, window = 2, 2, 256, 16, 100
    i = torch.arange(g * t).remainder(t)[:, None]
    j = torch.arange(t)[None, :]
    seen = (j <= i) & (i < j + window)
    p = torch.where(seen, wide((bsz, 1, g * t, t), "band-split", kind), torch.zeros(()))
    p[0, 0, 300, 40], p[1, 0, 20, 10] = float("nan"), float("inf")  # seen: key j <= query i < j + window
    if kind == "keys":
        a, b, band = p.transpose(-1, -2), normal((bsz, 1, g * t, d), "band-split", "b"), t_hp.KEY_ROWS
    else:
        a, b, band = p, normal((bsz, 1, t, d), "band-split", "b"), t_hp.QUERY_ROWS
    got = t_hp.hp_band_matmul_(a.to(CUDA), b.to(CUDA), band, t, window)
    assert mismatches(got, r_hp.hp_matmul_(a, b)) == 0
    assert bool(torch.isnan(got.cpu()).any())


def test_hp_gemm_row_flags():
    """hp_gemm(..., row_flags=) flags exactly the output rows holding a NaN or an infinity: a NaN row of A (in
    the second batch), one product overflowing float32 (row 5 of the first), rows past a tile's edge."""
    a, b = normal((2, 150, 24), "hp-flags"), normal((2, 70, 24), "hp-flags", "b")  # B^T rows
    a[0, 5, :], b[0, 3, :] = 1e30, 1e30   # a[0, 5] . b[0, 3] ~ 2e61: +inf after the rounding, the rest finite
    a[1, 7, 2] = float("nan")
    sa = t_hp.operand_rows(a.to(CUDA), 3, transpose=False)
    sb = t_hp.operand_rows(b.to(CUDA), 3, transpose=False)
    flags = torch.zeros(300, dtype=torch.int32, device=CUDA)
    out = t_hp.hp_gemm(sa, sb, 2, 150, 70, row_flags=flags)
    assert mismatches(out, t_hp.hp_gemm(sa, sb, 2, 150, 70)) == 0  # the flags change no bit of the product
    want = (~torch.isfinite(out.cpu())).any(-1).reshape(-1)
    assert want.sum() == 2 and bool(want[5]) and bool(want[150 + 7])
    assert torch.equal(flags.cpu() != 0, want)


@pytest.mark.parametrize("window,masked,t,k", [(None, True, 200, 24), (40, True, 200, 24), (5, False, 150, 24),
                                               (130, True, 256, 24), (40, True, 200, 16), (None, True, 130, 8)],
                         ids=str)
def test_hp_gemm_causal_walk_is_the_tile_kernel(window, masked, t, k, monkeypatch):
    """Attention's causal one-step products walk a row tile's key tiles in one program (_hp_rows_kernel): its
    output and row flags are the per-tile kernel's, every entry stored (store_unseen), with the scale, a NaN
    query row, an overflowing product, a forced row, query rows across a head boundary (T % 64 != 0), and
    contractions of 16 and 8 (a walk over K-steps of 16 gave wrong int8 products on the H200)."""
    g = 2
    a, b = normal((2, g * t, k), "walk", t, k), normal((2, t, k), "walk", t, k, "b")
    a[1, 7, 2] = float("nan")
    a[0, 5, :], b[0, 3, :] = 1e30, 1e30
    sa = t_hp.operand_rows(a.to(CUDA), 3, transpose=False)
    sb = t_hp.operand_rows(b.to(CUDA), 3, transpose=False)
    post = torch.tensor(0.125, device=CUDA)
    force = torch.zeros(2 * g * t, dtype=torch.int32, device=CUDA)
    force[g * t + 170] = 1

    def run(walk: bool, **kw):
        monkeypatch.setattr(t_hp, "CAUSAL_WALK", walk)
        flags = torch.zeros(2 * g * t, dtype=torch.int32, device=CUDA)
        out = t_hp.hp_gemm(sa, sb, 2, g * t, t, post=post, causal=(t, window), masked=masked, row_flags=flags,
                           **kw)
        return out, flags

    for kw in (dict(), dict(force=force)):
        (got, got_f), (want, want_f) = run(True, **kw), run(False, **kw)
        assert mismatches(got, want) == 0, kw
        assert torch.equal(got_f, want_f), kw
        assert bool((want_f != 0).any())


@pytest.mark.parametrize("case", ["finite", "nan-row", "inf-key", "overflow", "large"])
def test_hp_window_matmul(case):
    """dP of a sliding window over the tiles a window reaches: the reference's bits on every seen entry, and
    exact row flags; rows where an entry may be non-finite are written whole. nan-row: a NaN in dO (its row);
    inf-key: an infinite V entry (every row of that batch); overflow: one product past float32's range;
    large: exponents that allow an overflow without one (rows written whole, no flag)."""
    bsz, g, t, d, window = 2, 2, 256, 32, 40
    a, v = normal((bsz, 1, g * t, d), "hp-win", case), normal((bsz, 1, t, d), "hp-win", case, "v")
    if case == "nan-row":
        a[1, 0, 300, 3] = float("nan")
    if case == "inf-key":
        v[0, 0, 200, 5] = float("inf")
    if case == "overflow":  # a[1, 0, 10] . v[1, 0, 5] = |v5|^2 2^130: past float32 for every seed (a random
        a[1, 0, 10] = v[1, 0, 5] * 2.0 ** 100  # row instead left a product under 2^128 for ~3% of them)
        v[1, 0, 5] *= 2.0 ** 30
    if case == "large":  # exponents at least 100 + 22 (the bound's 127 - 5), whatever the seed; products ~2^122
        a[1, 0, 10] *= 2.0 ** 98
        a[1, 0, 10, 0] = 1.5 * 2.0 ** 99
        v[1, 0, 5] *= 2.0 ** 20
        v[1, 0, 5, 0] = 1.5 * 2.0 ** 21
    vt = v.transpose(-1, -2)
    flags = torch.zeros(bsz * g * t, dtype=torch.int32, device=CUDA)
    out = t_hp.hp_window_matmul_(a.to(CUDA), vt.to(CUDA), t, window, flags).cpu()
    want = r_hp.hp_matmul_(a, vt)
    want_flags = (~torch.isfinite(want)).any(-1).reshape(-1)
    assert torch.equal(flags.cpu() != 0, want_flags)
    assert bool(want_flags.any()) == (case not in ("finite", "large"))
    seen = r_att.allowed_keys(t, True, window).repeat(g, 1).expand(bsz, 1, g * t, t)
    assert mismatches(out[seen], want[seen]) == 0
    assert mismatches(out[want_flags.view(bsz, 1, g * t)], want[want_flags.view(bsz, 1, g * t)]) == 0
    if case == "large":  # the row that may overflow was written whole: its bits everywhere
        assert mismatches(out[1, 0, 10], want[1, 0, 10]) == 0


@pytest.mark.parametrize("n,d,v,chunk,z_weight,ignored", [(300, 40, 77, 1024, 1e-4, 0.2), (1300, 33, 50, 2048, 0.0, 0.0),
                                                          (64, 20, 30, 1024, 1e-3, 1.0),
                                                          pytest.param(2500, 40, 300, 1024, 1e-4, 0.1, marks=gpu_only),
                                                          pytest.param(4096, 2048, 32768, 1024, 1e-4, 0.05,
                                                                       marks=gpu_only)], ids=str)
def test_cross_entropy_zloss(n, d, v, chunk, z_weight, ignored):
    h, w = normal((n, d), "ce", n, v), normal((v, d), "ce", n, v, "w", std=0.5)
    tg = philox.random_bits(seed("ce", n, v, "t"), 0, n) % v
    tg = torch.where(philox.uniform(seed("ce", n, v, "drop"), 0, (n,)) < ignored, torch.full_like(tg, -100), tg)

    def run(fn, dev, grads=(True, True)):
        hh, ww = h.to(dev).clone().requires_grad_(grads[0]), w.to(dev).clone().requires_grad_(grads[1])
        loss, ce, z = fn(hh, ww, tg.to(dev), z_weight=z_weight, chunk=chunk)
        loss.backward(torch.tensor(1.5, device=dev))
        out = {"loss": loss, "ce": ce, "z": z}
        out.update({k: t.grad for k, t in (("dh", hh), ("dw", ww)) if t.grad is not None})
        return out

    assert_same(run(t_loss.cross_entropy_zloss, CUDA), run(r_loss.cross_entropy_zloss, CUDA),
                run(r_loss.cross_entropy_zloss, "cpu") if n < 4096 else None)
    if n < 200:
        for grads in ((True, False), (False, True)):  # one gradient alone skips the other's passes
            assert_same(run(t_loss.cross_entropy_zloss, CUDA, grads), run(r_loss.cross_entropy_zloss, CUDA, grads))


@pytest.mark.parametrize("n,chunk", [(2100, 1024), (1300, 2048), (2048, 2048), (1000, 1024)], ids=str)
def test_cross_entropy_zloss_dw_over_chunks_and_short_blocks(n, chunk):
    """The head's dW kernel: chunks of one or two token blocks (the first adds to zeros, the middle ones read and
    write the float64 sum, the last writes float32 dW), the last short; or one short block alone (no float64
    sum)."""
    d, v = 33, 50
    h, w = normal((n, d), "ce-dw", n), normal((v, d), "ce-dw", "w", std=0.5)
    tg = philox.random_bits(seed("ce-dw", "t"), 0, n) % v

    def grads(fn, dev):
        hh, ww = h.to(dev).clone().requires_grad_(True), w.to(dev).clone().requires_grad_(True)
        fn(hh, ww, tg.to(dev), chunk=chunk)[0].backward()
        return {"dh": hh.grad, "dw": ww.grad}

    assert_same(grads(t_loss.cross_entropy_zloss, CUDA), grads(r_loss.cross_entropy_zloss, "cpu"))


@pytest.mark.parametrize("slices", [1, 2, 4])
def test_cross_entropy_zloss_slices(slices):
    """The head's contractions at other slice counts than the default 3 (the row kernel cuts g's slices itself)."""
    n, d, v = 1100, 40, 77
    h, w = normal((n, d), "ce-sl", slices), normal((v, d), "ce-sl", slices, "w", std=0.5)
    tg = philox.random_bits(seed("ce-sl", slices, "t"), 0, n) % v

    def run(fn, dev):
        hh, ww = h.to(dev).clone().requires_grad_(True), w.to(dev).clone().requires_grad_(True)
        loss, ce, z = fn(hh, ww, tg.to(dev), chunk=1024, slices=slices)
        loss.backward()
        return {"loss": loss, "ce": ce, "z": z, "dh": hh.grad, "dw": ww.grad}

    assert_same(run(t_loss.cross_entropy_zloss, CUDA), run(r_loss.cross_entropy_zloss, "cpu"))


def test_cross_entropy_zloss_rows_with_edges():
    """The row kernel with ignored tokens, a token whose target is its largest logit, and a NaN token."""
    n, d, v = 300, 40, 77
    h, w = normal((n, d), "ce-row", n), normal((v, d), "ce-row", "w", std=0.5)
    tg = philox.random_bits(seed("ce-row", "t"), 0, n) % v
    tg[::7] = -100
    tg[3] = int(torch.argmax(h[3] @ w.t()))  # the target is the row's largest e: the largest other e is below 1
    h[11, 5] = float("nan")

    def run(fn, dev):
        hh, ww = h.to(dev).clone().requires_grad_(True), w.to(dev).clone().requires_grad_(True)
        loss, ce, z = fn(hh, ww, tg.to(dev), chunk=1024)
        loss.backward()
        return {"loss": loss, "ce": ce, "z": z, "dh": hh.grad, "dw": ww.grad}

    assert_same(run(t_loss.cross_entropy_zloss, CUDA), run(r_loss.cross_entropy_zloss, "cpu"))


def test_cross_entropy_zloss_nonfinite_row():
    h, w = normal((140, 24), "ce-nf"), normal((40, 24), "ce-nf", "w")
    h[7, 3] = float("nan")  # a NaN token: its logits, ce, z and g are NaN; the means are NaN
    tg = philox.random_bits(seed("ce-nf"), 0, 140) % 40
    twin = t_loss.cross_entropy_zloss(h.to(CUDA), w.to(CUDA), tg.to(CUDA), chunk=1024)
    want = r_loss.cross_entropy_zloss(h, w, tg, chunk=1024)
    assert all(mismatches(a, b) == 0 for a, b in zip(twin, want))


# --- attention: hp logits, BR softmax, int8 P.V; backward through the hp and softmax twins ---

@pytest.mark.parametrize("b,hq,hkv,t,d,kw", [(1, 2, 1, 20, 16, dict(pv_block=8)),
                                            (1, 2, 2, 33, 24, dict(pv_block=16, window=5)),
                                            (1, 1, 1, 24, 16, dict(pv_block=64, causal=False)),
                                            (1, 1, 1, 5, 8, dict(pv_block=7, scale=0.3)),
                                            # several logits tiles, some wholly masked (skipped), tiles of query
                                            # rows across a head boundary (T not a multiple of the tile)
                                            (1, 4, 2, 200, 16, dict(pv_block=16, window=40)),
                                            (1, 2, 1, 150, 8, dict(pv_block=32)),
                                            # T a multiple of the band's 128: the backward's splits and
                                            # contractions over the band (one range of 128 + 128 keys, and
                                            # a window past 128: ranges of 128 + 256, and their edges at T)
                                            (1, 4, 2, 256, 16, dict(pv_block=16, window=40)),
                                            (2, 2, 1, 384, 8, dict(pv_block=32, window=129)),
                                            # a global causal layer's band: a key tile's queries up to T, a
                                            # query tile's keys from 0; a window of T or more is the same
                                            (1, 4, 2, 256, 16, dict(pv_block=16)),
                                            (2, 2, 1, 384, 8, dict(pv_block=32, window=400)),
                                            pytest.param(2, 16, 4, 1024, 128, dict(pv_block=64), marks=gpu_only),
                                            pytest.param(1, 8, 2, 1000, 64, dict(pv_block=100, window=256),
                                                         marks=gpu_only),
                                            pytest.param(1, 16, 4, 2048, 128, dict(pv_block=64, window=512),
                                                         marks=gpu_only)], ids=str)
def test_attention(b, hq, hkv, t, d, kw):
    q = normal((b, hq, t, d), "att", t, d, std=2.0)
    k, v = normal((b, hkv, t, d), "att", t, d, "k"), normal((b, hkv, t, d), "att", t, d, "v")
    g = normal((b, hq, t, d), "att", t, d, "g")
    three_ways(lambda x, y, z: t_att.attention(x, y, z, **kw), lambda x, y, z: r_att.attention(x, y, z, **kw),
               [q, k, v], g, cpu=t < 1000)


@pytest.mark.parametrize("where", ["v", "go", "q"])
def test_attention_nonfinite_window(where):
    """A sliding window's backward with a non-finite input: an infinite V entry (every row of dP flagged, read in
    full), a NaN in dO (that row flagged), a NaN in q (a NaN row of P, read over its window)."""
    q, k, v = normal((1, 2, 40, 16), "att-nfw"), normal((1, 1, 40, 16), "att-nfw", "k"), \
        normal((1, 1, 40, 16), "att-nfw", "v")
    g = normal((1, 2, 40, 16), "att-nfw", "g")
    {"v": v, "go": g, "q": q}[where][0, 0, 17, 3] = float("inf") if where == "v" else float("nan")
    kw = dict(window=6, pv_block=8)
    three_ways(lambda x, y, z: t_att.attention(x, y, z, **kw), lambda x, y, z: r_att.attention(x, y, z, **kw),
               [q, k, v], g)


@pytest.mark.parametrize("window,at", [(40, 400), (None, 100)], ids=["window", "global"])
@pytest.mark.parametrize("where", ["v", "go", "q", "q-all-inf"])
def test_attention_nonfinite_band(where, window, at):
    """The same on the backward's band path (T a multiple of 128): a non-finite row of P or dP sets every key of
    its batch bad in P^T's or dS^T's split although it lies outside most keys' bands; the other batch stays
    finite. q-all-inf: a query whose logits are all +inf (its P row NaN). Query `at` lies outside the bands of
    most keys: with a window of 40, of keys 0..255 (their queries end at 256); in a global layer, of keys
    128.. (their queries start at 128), and its P row is read off P itself (attention._nan_rows)."""
    q, k, v = normal((2, 2, 512, 16), "att-nfb"), normal((2, 1, 512, 16), "att-nfb", "k"), \
        normal((2, 1, 512, 16), "att-nfb", "v")
    g = normal((2, 2, 512, 16), "att-nfb", "g")
    if where == "q-all-inf":
        q[1, 1, at] = float("inf")
    else:
        {"v": v, "go": g, "q": q}[where][1, 0, at, 3] = float("inf") if where == "v" else float("nan")
    kw = dict(window=window, pv_block=16)
    three_ways(lambda x, y, z: t_att.attention(x, y, z, **kw), lambda x, y, z: r_att.attention(x, y, z, **kw),
               [q, k, v], g)


def test_attention_nonfinite():
    q, k, v = normal((1, 2, 18, 16), "att-nf"), normal((1, 1, 18, 16), "att-nf", "k"), normal((1, 1, 18, 16),
                                                                                             "att-nf", "v")
    v[0, 0, 4, 3] = float("inf")   # a NaN output column
    q[0, 1, 9, 0] = float("nan")   # a NaN logits row (and output row)
    want = r_att.attention(q, k, v, pv_block=8)
    assert mismatches(t_att.attention(q.to(CUDA), k.to(CUDA), v.to(CUDA), pv_block=8), want) == 0
