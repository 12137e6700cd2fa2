"""The Triton twins compile for the H200 (sm_90) on this CPU machine, and their PTX holds no FMA
contraction, no approximate division, reciprocal, sqrt or exponent, and no flush-to-zero
(BR contract points 7 and 8).

Needs the `triton` package (the `gpu` extra); skipped without it. No GPU is used: triton.compile
runs its whole pipeline (ptxas included) for an explicit target.
"""
from __future__ import annotations

import re
import struct

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernels.triton import adamw, elementary, reduce, rmsnorm, rope, softmax, statehash, swiglu  # noqa: E402
from kernels.triton.launch import BR_OPTIONS  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
FORBIDDEN = re.compile(r"\b(fma\.rn\.f(32|64)|mad\.(rn\.)?f(32|64)|(div|rcp|sqrt|rsqrt|ex2|lg2)\.approx"
                       r"|div\.full|[a-z0-9.]*\.ftz[a-z0-9.]*)")
P32, P64, I32, I64 = "*fp32", "*fp64", "*i32", "*i64"


def ptx(fn, sig: dict, **constexprs) -> str:
    """PTX of a jit function for sm_90, compiled with the launch options every twin uses."""
    sig = {**sig, **{k: "constexpr" for k in constexprs}}
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    return triton.compile(src, target=TARGET, options=dict(BR_OPTIONS)).asm["ptx"]


def _double_hex(v: float) -> str:
    return "0d" + struct.pack(">d", v).hex().upper()


KERNELS = {
    **{f"unary_fwd_{op}": (elementary._forward_kernel, {"x_ptr": P32, "y_ptr": P32, "n": "i32"},
                           dict(OP=op, BLOCK=1024)) for op in range(5)},
    **{f"unary_bwd_{op}": (elementary._backward_kernel, {"g_ptr": P32, "s_ptr": P32, "dx_ptr": P32, "n": "i32"},
                           dict(OP=op, BLOCK=1024)) for op in range(5)},
    "sum_stats": (reduce._stats_kernel, {"x_ptr": P32, "amax_ptr": P64, "flags_ptr": I32, "n": "i32", "span": "i32",
                                         "S": "i32"}, dict(BLOCK=1024)),
    "sum_fixed": (reduce._sum_kernel, {"x_ptr": P64, "amax_ptr": P64, "part_ptr": I64, "n": "i32", "span": "i32",
                                       "S": "i32", "top": "i32"}, dict(S_POW2=4, BLOCK=1024)),
    "sum_finish": (reduce._finish_kernel, {"amax_ptr": P64, "flags_ptr": I32, "part_ptr": I64, "out_ptr": P32,
                                           "S": "i32", "top": "i32", "scale_bits": "i64"},
                   dict(HAS_SCALE=True, S_POW2=4)),
    "sum_row": (reduce._row_kernel, {"x_ptr": P32, "out_ptr": P32, "n": "i32", "top": "i32", "scale_bits": "i64"},
                dict(HAS_SCALE=True, BLOCK=2048)),
    "rmsnorm_fwd": (rmsnorm._forward_kernel, {"x_ptr": P32, "w_ptr": P32, "y_ptr": P32, "rstd_ptr": P32, "D": "i32",
                                              "top": "i32", "inv_bits": "i64", "eps": "fp32"},
                    dict(HAS_W=True, BLOCK=2048)),
    "rmsnorm_dx": (rmsnorm._dx_kernel, {"g_ptr": P32, "x_ptr": P32, "w_ptr": P32, "rstd_ptr": P32, "dx_ptr": P32,
                                        "D": "i32", "top": "i32", "inv_bits": "i64"}, dict(HAS_W=True, BLOCK=2048)),
    "rmsnorm_dw_stats": (rmsnorm._dw_stats_kernel, {"g_ptr": P32, "x_ptr": P32, "rstd_ptr": P32, "amax_ptr": P64,
                                                    "flags_ptr": I32, "R": "i32", "D": "i32", "span": "i32"},
                         dict(ROWS=32, BLOCK=64)),
    "rmsnorm_dw_sum": (rmsnorm._dw_sum_kernel, {"g_ptr": P32, "x_ptr": P32, "rstd_ptr": P32, "amax_ptr": P64,
                                                "part_ptr": I64, "R": "i32", "D": "i32", "span": "i32", "S": "i32",
                                                "top": "i32"}, dict(S_POW2=4, ROWS=32, BLOCK=64)),
    "rmsnorm_dw_finish": (rmsnorm._dw_finish_kernel, {"amax_ptr": P64, "flags_ptr": I32, "part_ptr": I64,
                                                      "dw_ptr": P32, "D": "i32", "S": "i32", "top": "i32"},
                          dict(S_POW2=4, BLOCK=64)),
    "swiglu_fwd": (swiglu._forward_kernel, {"x_ptr": P32, "y_ptr": P32, "F": "i32"}, dict(BLOCK=1024)),
    "swiglu_bwd": (swiglu._backward_kernel, {"x_ptr": P32, "g_ptr": P32, "dx_ptr": P32, "F": "i32"}, dict(BLOCK=1024)),
    "rope": (rope._rotate_kernel, {"x_ptr": P32, "cos_ptr": P32, "sin_ptr": P32, "y_ptr": P32, "n_rows": "i32",
                                   "T": "i32", "H": "i32"}, dict(NEG_SIN=True, ROWS=32, BLOCK_H=64)),
    "softmax_fwd": (softmax._forward_kernel, {"x_ptr": P32, "y_ptr": P32, "n": "i32", "top": "i32"},
                    dict(BLOCK=2048)),
    "softmax_bwd": (softmax._backward_kernel, {"y_ptr": P32, "g_ptr": P32, "dx_ptr": P32, "n": "i32", "top": "i32"},
                    dict(BLOCK=2048)),
    "adamw_bf16": (adamw._step_kernel, {"p_ptr": "*bf16", "g_ptr": "*bf16", "m_ptr": P32, "v_ptr": P32,
                                        "k_ptr": P32, "n": "i32"}, dict(BLOCK=1024)),
    "blake3_chunk": (statehash._chunk_kernel, {"w_ptr": I32, "cv_ptr": I32, "n_bytes": "i64", "n_chunks": "i64"},
                     dict(IS_ROOT=False, LANES=128)),
    "blake3_parent": (statehash._parent_kernel, {"cv_in": I32, "cv_out": I32, "n": "i64"},
                      dict(IS_ROOT=False, LANES=128)),
}


@pytest.fixture(scope="module")
def compiled() -> dict[str, str]:
    return {name: ptx(fn, sig, **ce) for name, (fn, sig, ce) in KERNELS.items()}


def test_no_fma_and_no_approximate_ops(compiled):
    bad = {name: sorted(set(m.group(0) for m in FORBIDDEN.finditer(text))) for name, text in compiled.items()}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_division_and_sqrt_are_correctly_rounded(compiled):
    assert "div.rn.f64" in compiled["unary_fwd_3"]          # sigmoid: 1 / (1 + e^-x) in float64
    assert "sqrt.rn.f64" in compiled["unary_fwd_2"]         # rsqrt: the correctly rounded sqrt
    assert "div.rn.f32" in compiled["softmax_fwd"]          # 1 / s
    assert "div.rn.f32" in compiled["adamw_bf16"] and "sqrt.rn.f64" in compiled["adamw_bf16"]
    assert "cvt.rn.bf16.f32" in compiled["adamw_bf16"]      # the one rounding to the param dtype: to nearest even


def test_float64_constants_are_the_references_doubles(compiled):
    from kernels.ref import elementary as E

    text = compiled["unary_fwd_0"]
    for v in (E.LOG2E, E.LN2_HI, E.LN2_LO, E._INV_FACT[13], E._INV_FACT[3], 709.9):
        assert _double_hex(v) in text, v
    assert _double_hex(float(struct.unpack("<f", struct.pack("<f", 709.9))[0])) not in text  # a float32-rounded bound
