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


from kernels.triton import adamw, elementary, reduce, rmsnorm, rope, softmax, statehash, swiglu  # noqa: E402
from kernels.triton import attention, contraction, embedding, hadamard, int8_linear, intmm  # noqa: E402
from kernels.triton import exactsum, loss, rotated_mm  # noqa: E402
from kernels.triton.offline import compile_sm90, ptxas_usage  # noqa: E402

FORBIDDEN = re.compile(r"\b(fma\.rn\.f(32|64)|mad\.(rn\.)?f(32|64)|(div|rcp|sqrt|rsqrt|ex2|lg2)\.approx"
                       r"|div\.full|[a-z0-9.]*\.ftz[a-z0-9.]*)")
P32, P64, I32, I64, I8 = "*fp32", "*fp64", "*i32", "*i64", "*i8"


def ptx(fn, sig: dict, options: dict | None = None, **constexprs) -> str:
    """PTX of a jit function for sm_90 (kernels/triton/offline.compile_sm90)."""
    return compile_sm90(fn, sig, options, **constexprs).asm["ptx"]


def _double_hex(v: float) -> str:
    return "0d" + struct.pack(">d", v).hex().upper()


BLAKE3_SIG = {"table": "*i64", "starts": "*i64", "ws": I32, "T": "i32", "one": "i32"}  # both BLAKE3 kernels

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
    "l2_stats": (reduce._l2_stats_kernel, {"table": I64, "starts": I64, "T": "i32", "amax_ptr": P64, "bad_ptr": P64},
                 dict(BF16=True, TPAD=256, BLOCK=1024)),
    "l2_sum": (reduce._l2_sum_kernel, {"table": I64, "starts": I64, "T": "i32", "s_ptr": I64, "part_ptr": I64},
               dict(BF16=False, TPAD=256, BLOCK=1024)),
    "exactsum_accumulate": (exactsum._accumulate_kernel, {"g0_ptr": P32, "g1_ptr": P32, "g2_ptr": P32, "g3_ptr": P32,
                                                          "limbs_ptr": I64, "bad_ptr": P64, "n": "i32"},
                            dict(PARTIALS=4, FRESH=False, BLOCK=1024)),
    "exactsum_result_limbs": (exactsum._result_kernel, {"src_ptr": I64, "bad_ptr": P64, "out_ptr": P32, "n": "i32",
                                                        "scale_bits": "i64"},
                              dict(PENDING=False, HAS_BAD=True, BLOCK=1024)),
    "exactsum_result_pending": (exactsum._result_kernel, {"src_ptr": P32, "bad_ptr": P64, "out_ptr": P32, "n": "i32",
                                                          "scale_bits": "i64"},
                                dict(PENDING=True, HAS_BAD=False, BLOCK=1024)),
    "rmsnorm_fwd": (rmsnorm._forward_kernel, {"x_ptr": P32, "w_ptr": P32, "y_ptr": P32, "rstd_ptr": P32, "N": "i32",
                                              "D": "i32", "top": "i32", "inv_bits": "i64", "eps": "fp32"},
                    dict(HAS_W=True, R=1, BLOCK=2048)),
    "rmsnorm_fwd_short_rows": (rmsnorm._forward_kernel, {"x_ptr": P32, "w_ptr": P32, "y_ptr": P32, "rstd_ptr": P32,
                                                         "N": "i32", "D": "i32", "top": "i32", "inv_bits": "i64",
                                                         "eps": "fp32"}, dict(HAS_W=False, R=8, BLOCK=128)),
    "rmsnorm_dx": (rmsnorm._dx_kernel, {"g_ptr": P32, "x_ptr": P32, "w_ptr": P32, "rstd_ptr": P32, "dx_ptr": P32,
                                        "N": "i32", "D": "i32", "top": "i32", "inv_bits": "i64"},
                   dict(HAS_W=True, R=1, BLOCK=2048)),
    "rmsnorm_dx_short_rows": (rmsnorm._dx_kernel, {"g_ptr": P32, "x_ptr": P32, "w_ptr": P32, "rstd_ptr": P32,
                                                   "dx_ptr": P32, "N": "i32", "D": "i32", "top": "i32",
                                                   "inv_bits": "i64"}, dict(HAS_W=False, R=8, BLOCK=128)),
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
                    dict(BLOCK=2048, ONE=False)),
    "softmax_fwd_row": (softmax._forward_kernel, {"x_ptr": P32, "y_ptr": P32, "n": "i32", "top": "i32"},
                        dict(BLOCK=2048, ONE=True)),
    "softmax_fwd_causal": (softmax._causal_forward_kernel, {"x_ptr": P32, "y_ptr": P32, "nan_ptr": I32, "n": "i32",
                                                          "window": "i32", "top": "i32"}, dict(BAND=512, BLOCK=2048)),
    "softmax_bwd_causal": (softmax._causal_backward_kernel, {"y_ptr": P32, "g_ptr": P32, "dx_ptr": P32,
                                                            "flags_ptr": I32, "n": "i32", "window": "i32",
                                                            "top": "i32"},
                           dict(BAND=512, BLOCK=2048)),
    "softmax_bwd": (softmax._backward_kernel, {"y_ptr": P32, "g_ptr": P32, "dx_ptr": P32, "n": "i32", "top": "i32"},
                    dict(BLOCK=2048)),
    "adamw_bf16": (adamw._step_kernel, {"p_ptr": "*bf16", "g_ptr": "*bf16", "m_ptr": P32, "v_ptr": P32,
                                        "k_ptr": P32, "n": "i32"}, dict(BLOCK=1024)),
    "blake3_chunk": (statehash._chunk_kernel, BLAKE3_SIG, dict(TPAD=64, LANES=128, V4=False, PREFETCH=False)),
    "blake3_chunk_v4": (statehash._chunk_kernel, BLAKE3_SIG, dict(TPAD=64, LANES=128, V4=True, PREFETCH=True)),
    "blake3_group": (statehash._group_kernel, BLAKE3_SIG, dict(TPAD=64, GROUP=256, LOG_GROUP=8)),
}

GEMM_SIG = {"a_ptr": I8, "b_ptr": I8, "out_ptr": P32, "M": "i32", "N": "i32", "K": "i32", "s_ab": "i32", "s_am": "i32",
            "s_bb": "i32", "s_bn": "i32", "s_ob": "i32", "s_om": "i32", "rs_ptr": P32, "cs_ptr": P32, "inv": "fp32",
            "badr_ptr": I32, "badc_ptr": I32, "msrc_ptr": P32, "mscale_ptr": P32, "mscale_stride": "i32"}
GEMM_ALIGNED = ("K", "s_ab", "s_am", "s_bb", "s_bn", "s_ob", "s_om")


def _gemm_launch(tile: dict, **constexprs) -> tuple[dict, dict]:
    """(compile options, constexprs) of an int8 GEMM launched at a production tile (intmm.TILE, MASK_TILE)."""
    opts = dict(aligned=GEMM_ALIGNED, num_warps=tile["num_warps"], num_stages=tile["num_stages"])
    return opts, {**constexprs, **{k: v for k, v in tile.items() if k not in ("num_warps", "num_stages")}}



W8 = dict(num_warps=8)
HP_CFG = dict(BM=128, BN=64, BK=128, GROUP_M=8)
HP_OPTS = dict(aligned=("Kp", "sa", "sb"), num_warps=8, num_stages=3)
WALK_OPTS = dict(aligned=("Kp", "sa", "sb"), num_warps=4, num_stages=2)
DW_SIG = {"ga_ptr": I8, "hb_ptr": I8, "ea_ptr": I64, "eb_ptr": I64, "bada_ptr": I32, "badb_ptr": I32, "dw_ptr": P64,
          "dw32_ptr": P32, "inv_bits": "i64", "V": "i32", "D": "i32", "NB": "i32", "Kp": "i32", "sa": "i32", "sb": "i32"}
HP_SIG = {"a_ptr": I8, "b_ptr": I8, "ea_ptr": I64, "eb_ptr": I64, "bada_ptr": I32, "badb_ptr": I32, "out_ptr": P32,
          "post_ptr": P32, "flags_ptr": I32, "force_ptr": I32, "M": "i32", "N": "i32", "Kp": "i32", "sa": "i32", "sb": "i32", "T": "i32",
          "window": "i32"}
SPLIT_SIG = {"x_ptr": P32, "s_batch": "i32", "RB": "i32", "s_row": "i32", "s_col": "i32", "rows": "i32", "K": "i32",
             "lim": "i32", "Kp": "i32", "SEG": "i32", "NSEG": "i32", "part_ptr": P64, "badp_ptr": I32, "q_ptr": I8,
             "e_ptr": I64, "bad_ptr": I32}
BAND_SIG = {"x_ptr": P32, "s_batch": "i32", "RB": "i32", "s_row": "i32", "s_col": "i32", "rows": "i32", "K": "i32",
            "Kp": "i32", "T": "i32", "window": "i32", "bbad_ptr": I32, "q_ptr": I8, "e_ptr": I64, "bad_ptr": I32}
SPLIT_ALIGNED = dict(aligned=("s_batch", "s_row", "K", "lim", "Kp", "T"), num_warps=8)


def _without(sig: dict, name: str) -> dict:
    return {k: v for k, v in sig.items() if k != name}


# the int8, Hadamard, embedding, contraction and loss twins
INT8_KERNELS = {
    "int8_mm": (intmm._gemm_kernel, {**GEMM_SIG, "out_ptr": I32},
                *_gemm_launch(intmm.TILE, s_ak=1, s_bk=1, FLOAT_OUT=False, HAS_ROW=False, HAS_COL=False,
                              HAS_INV=False, HAS_BAD=False, HAS_MASK=False)),
    "int8_gemm_epilogue": (intmm._gemm_kernel, GEMM_SIG,  # the gated epilogue: launched at MASK_TILE
                           *_gemm_launch(intmm.MASK_TILE, s_ak=1, s_bk=1, FLOAT_OUT=True, HAS_ROW=True, HAS_COL=True,
                                         HAS_INV=True, HAS_BAD=True, HAS_MASK=True)),
    "hadamard_256": (hadamard._pass_kernel, {"x_ptr": P32, "y_ptr": P32, "rows": "i32", "n_in": "i32",
                                             "n_out": "i32", "C": "i32", "Q": "i32"}, W8,
                     dict(P=16, LOG_P=4, S=16, LOG_S=4, R=16)),
    "hadamard_1024_f64": (hadamard._pass_kernel, {"x_ptr": P64, "y_ptr": P64, "rows": "i32", "n_in": "i32",
                                                  "n_out": "i32", "C": "i32", "Q": "i32"}, W8,
                          dict(P=32, LOG_P=5, S=32, LOG_S=5, R=4)),
    "rotate_quantize": (rotated_mm._rotate_quantize_kernel,
                        {"src_ptr": "*bf16", "s_row": "i32", "s_col": "i32", "rows": "i32", "C": "i32", "Kp": "i32",
                         "pre_ptr": P32, "pre_stride": "i32", "q_ptr": I8, "step_ptr": P32, "bad_ptr": I32,
                         "tmp_ptr": P32}, W8, dict(PRE=True, ROTATE=True, P=16, LOG_P=4, S=16, LOG_S=4, L=256,
                                                          R=16)),
    "int8_weight": (int8_linear._weight_kernel, {"w_ptr": P32, "N": "i32", "K": "i32", "Kp": "i32", "top": "i32",
                                                 "inv_bits": "i64", "repin": "fp32", "sx_ptr": P32, "sw_ptr": P32,
                                                 "cs_ptr": P32, "bad_ptr": I32, "q_ptr": I8}, {},
                    dict(QUANT=True, R=1, BK=1024)),
    "int8_activation": (int8_linear._activation_kernel, {"x_ptr": P32, "sx_ptr": P32, "q_ptr": I8, "bad_ptr": I32,
                                                         "M": "i32", "K": "i32", "Kp": "i32"}, {}, dict(R=16, BK=128)),
    "int8_lsq_stats": (int8_linear._lsq_stats_kernel, {"dxh_ptr": P32, "x_ptr": P32, "sx_ptr": P32, "dx_ptr": P32,
                                                       "amax_ptr": P64, "flags_ptr": I32, "n": "i32", "span": "i32"},
                       {}, dict(NEED_X=True, BLOCK=1024)),
    "int8_lsq_sum": (int8_linear._lsq_sum_kernel, {"dxh_ptr": P32, "x_ptr": P32, "sx_ptr": P32, "amax_ptr": P64,
                                                   "part_ptr": I64, "n": "i32", "span": "i32", "S": "i32",
                                                   "top": "i32"}, {}, dict(S_POW2=4, BLOCK=1024)),
    "embedding_stats": (embedding._stats_kernel, {"g_ptr": "*bf16", "amax_ptr": P64, "flags_ptr": I32, "total": "i32",
                                                  "span": "i32"}, {}, dict(BLOCK=1024)),
    "embedding_clear": (embedding._clear_kernel, {"any_ptr": I32, "buf_ptr": I32, "total": "i32", "span": "i32"}, {},
                        dict(BLOCK=1024)),
    "embedding_scatter": (embedding._scatter_kernel, {"g_ptr": P32, "ids_ptr": I64, "amax_ptr": P64, "any_ptr": I32,
                                                      "acc_ptr": I64, "flag_ptr": I32, "N": "i32", "D": "i32",
                                                      "S": "i32", "top": "i32"}, {}, dict(S_POW2=4, R=8, BD=256)),
    "embedding_finish": (embedding._finish_kernel, {"acc_ptr": I64, "flag_ptr": I32, "amax_ptr": P64, "any_ptr": I32,
                                                    "out_ptr": P32, "total": "i32", "S": "i32", "top": "i32"}, {},
                         dict(S_POW2=4, BLOCK=1024)),
    "hp_split": (contraction._split_kernel, SPLIT_SIG, W8, dict(STATS=False, SLICES=3, R=32, BK=64)),
    "hp_split_segments": (contraction._split_kernel, SPLIT_SIG, W8, dict(STATS=True, SLICES=3, R=32, BK=64)),
    "hp_band_split": (contraction._band_split_kernel, BAND_SIG, W8,
                      dict(KBAND=1, BATCH_BAD=True, SLICES=3, R=32, BK=64)),
    # row-major splits as launched: s_col = 1 (specialized to a constant), sizes multiples of 16
    "hp_split_rows": (contraction._split_kernel, _without(SPLIT_SIG, "s_col"), SPLIT_ALIGNED,
                      dict(s_col=1, STATS=False, SLICES=3, R=32, BK=64)),
    "hp_band_split_rows": (contraction._band_split_kernel, _without(BAND_SIG, "s_col"), SPLIT_ALIGNED,
                           dict(s_col=1, KBAND=2, BATCH_BAD=True, SLICES=3, R=32, BK=64)),
    "hp_split_stats": (contraction._split_stats_kernel, {"x_ptr": P32, "s_batch": "i32", "RB": "i32", "s_row": "i32",
                                                         "s_col": "i32", "rows": "i32", "K": "i32", "lim": "i32",
                                                         "SEG": "i32", "part_ptr": P64, "badp_ptr": I32}, W8,
                       dict(R=32, BK=128)),
    "hp_gemm": (contraction._hp_kernel, HP_SIG, HP_OPTS,
                dict(HAS_POST=True, CAUSAL=False, WINDOW=False, MASKED=True, STORE_UNSEEN=True, ROW_FLAGS=False, FORCE=False, LONG_K=False,
                     KBAND=0, SLICES=3, **HP_CFG)),
    "hp_gemm_long_k": (contraction._hp_kernel, HP_SIG, HP_OPTS,
                       dict(HAS_POST=False, CAUSAL=False, WINDOW=False, MASKED=True, STORE_UNSEEN=True, ROW_FLAGS=False, FORCE=False,
                            LONG_K=True, KBAND=0, SLICES=3, **HP_CFG)),
    "hp_gemm_causal": (contraction._hp_kernel, HP_SIG, HP_OPTS,
                       dict(HAS_POST=True, CAUSAL=True, WINDOW=True, MASKED=True, STORE_UNSEEN=False, ROW_FLAGS=False, FORCE=False,
                            LONG_K=False, KBAND=0, SLICES=3, **HP_CFG)),
    "hp_gemm_row_flags": (contraction._hp_kernel, HP_SIG, HP_OPTS,
                          dict(HAS_POST=False, CAUSAL=False, WINDOW=False, MASKED=True, STORE_UNSEEN=True, ROW_FLAGS=True, FORCE=False,
                               LONG_K=False, KBAND=0, SLICES=3, **HP_CFG)),
    "hp_gemm_window": (contraction._hp_kernel, HP_SIG, HP_OPTS,  # dP of a sliding window: hp_window_matmul_
                       dict(HAS_POST=False, CAUSAL=True, WINDOW=True, MASKED=False, STORE_UNSEEN=False, ROW_FLAGS=True,
                            FORCE=True, LONG_K=False, KBAND=0, SLICES=3, **HP_CFG)),
    "hp_gemm_band": (contraction._hp_kernel, HP_SIG, HP_OPTS,
                     dict(HAS_POST=False, CAUSAL=False, WINDOW=False, MASKED=True, STORE_UNSEEN=True, ROW_FLAGS=False, FORCE=False,
                          LONG_K=False, KBAND=1, SLICES=3, **HP_CFG)),
    # attention's causal one-step products walking a row tile's key tiles: the logits, and a window's dP
    "hp_walk_logits": (contraction._hp_rows_kernel, HP_SIG, WALK_OPTS,
                       dict(HAS_POST=True, WINDOW=True, MASKED=True, STORE_UNSEEN=False, ROW_FLAGS=False, FORCE=False,
                            SLICES=3, BM=64, BN=64, BK=128)),
    "hp_walk_window": (contraction._hp_rows_kernel, HP_SIG, WALK_OPTS,
                       dict(HAS_POST=False, WINDOW=True, MASKED=False, STORE_UNSEEN=False, ROW_FLAGS=True, FORCE=True,
                            SLICES=3, BM=64, BN=64, BK=128)),
    "loss_row": (loss._row_kernel, {"buf_ptr": P32, "targets_ptr": I64, "ce_ptr": P32, "z_ptr": P32, "V": "i32",
                                    "top": "i32", "ignore_index": "i32", "z2": "fp32", "q_ptr": I8, "e_ptr": I64,
                                    "bad_ptr": I32, "plane": "i32", "Kp": "i32"}, dict(num_warps=8),
                 dict(NEED_G=True, SPLIT_G=True, SLICES=3, BLOCK=2048)),
    "loss_dw": (loss._dw_kernel, DW_SIG, HP_OPTS, dict(FIRST=False, LAST=True, SLICES=3, **HP_CFG)),
    "attention_v": (attention._v_kernel, {"v_ptr": P32, "qv_ptr": I8, "sv_ptr": P32, "s_ptr": I64, "bad_ptr": I32,
                                          "T": "i32", "D": "i32", "NB": "i32", "top": "i32"}, {},
                    dict(BLK=64, BLKP=64, BD=64, TT=32)),
    "attention_pv": (attention._pv_kernel, {"p_ptr": P32, "qv_ptr": I8, "sv_ptr": P32, "s_ptr": I64,
                                            "vbad_ptr": I32, "out_ptr": P32, "M": "i32", "T": "i32", "D": "i32",
                                            "NB": "i32", "window": "i32"}, W8,
                     dict(CAUSAL=True, WINDOW=True, BLK=64, BLKP=64, BM=attention.PV_BM, BD=attention.PV_BD)),
}


@pytest.fixture(scope="module")
def compiled_int8() -> dict[str, str]:
    return {name: ptx(fn, sig, opts, **ce) for name, (fn, sig, opts, ce) in INT8_KERNELS.items()}


def test_int8_twins_have_no_fma_and_no_approximate_ops(compiled_int8):
    bad = {name: sorted(set(m.group(0) for m in FORBIDDEN.finditer(text))) for name, text in compiled_int8.items()}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_int8_gemms_run_on_hopper_int8_tensor_cores(compiled_int8):
    """wgmma s8 x s8 -> s32 (not the older mma.sync path), fed by async copies (a pipelined K loop)."""
    for name in ("int8_mm", "int8_gemm_epilogue", "hp_gemm", "hp_gemm_causal", "hp_gemm_band", "hp_gemm_window",
                 "hp_walk_logits", "hp_walk_window", "loss_dw"):
        text = compiled_int8[name]
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.s32\.s8\.s8", text), name
        assert "cp.async" in text, name


def test_row_splits_load_16_bytes(compiled_int8):
    """A row-major split (K contiguous, K and lim or T multiples of 16 and specialized) loads 4 floats an
    instruction and stores its int8 slices at least 8 bytes at a time: the masks and K offsets are visibly
    16-aligned. With K unspecialized (the previous launch) every load was one float and the band split's
    stores one byte."""
    for kernel, sizes in ((contraction._split_kernel, {"K", "lim"}), (contraction._split_stats_kernel, {"K", "lim"}),
                          (contraction._band_split_kernel, {"K", "T"})):  # the launch specializes them
        assert not sizes & {p.name for p in kernel.params if p.do_not_specialize}, kernel.fn.__name__
    for name in ("hp_split_rows", "hp_band_split_rows"):
        assert re.search(r"ld\.global(\.[a-z]+)*\.v4\.b32", compiled_int8[name]), name
        assert not re.search(r"st\.global(\.[a-z]+)*\.b8", compiled_int8[name]), name


def test_pv_runs_on_int8_tensor_cores(compiled_int8):
    """P.V's tile of 16 rows is below wgmma's 64: its per-block products run as int8 mma.sync (m16n8k32). A block's
    product is at most 127 * 127 * MAX_KEYS (256) in magnitude, so the int32 saturation that form carries never acts."""
    assert re.search(r"mma\.sync\.aligned\.m16n8k32\.row\.col(\.satfinite)?\.s32\.s8\.s8\.s32",
                     compiled_int8["attention_pv"])


def test_the_head_contraction_fits_its_registers():
    """The hp GEMM at its production tile (contraction.config(3)) keeps its three int32 accumulators and the
    int64/float64 epilogue in registers: ptxas reports no spills (a spill in the K loop is local-memory traffic
    on every step). The report is read from Triton's own ptxas."""
    fn, sig, opts, ce = INT8_KERNELS["hp_gemm"]
    cfg = contraction.config(3)
    assert {k: ce[k] for k in ("BM", "BN", "BK", "GROUP_M")} == {k: cfg[k] for k in ("BM", "BN", "BK", "GROUP_M")}
    assert (opts["num_warps"], opts["num_stages"]) == (cfg["num_warps"], cfg["num_stages"])
    use = ptxas_usage(compile_sm90(fn, sig, opts, **ce))
    assert 0 < use["registers"] <= 255 and use["shared"] > 0, use
    assert use["spill_stores"] == 0 and use["spill_loads"] == 0, use


def test_int8_twins_division_and_rounding(compiled_int8):
    assert "div.rn.f32" in compiled_int8["int8_gemm_epilogue"]      # the straight-through gate's w / s_w
    assert "div.rn.f32" in compiled_int8["rotate_quantize"] and "div.rn.f32" in compiled_int8["int8_activation"]
    assert "cvt.rni.f64.f64" in compiled_int8["rotate_quantize"]    # round half to even (torch.round)
    assert "div.rn.f64" in compiled_int8["loss_row"]                # log64's f / (f + 2)
    assert "atom.global" in compiled_int8["embedding_scatter"] and ".u64" in compiled_int8["embedding_scatter"]
    from kernels.ref import elementary as E
    assert _double_hex(E.SQRT_HALF) in compiled_int8["loss_row"]    # log64's bound stays a double


@pytest.fixture(scope="module")
def compiled() -> dict[str, str]:
    return {name: ptx(fn, sig, **ce) for name, (fn, sig, ce) in KERNELS.items()}


def test_no_fma_and_no_approximate_ops(compiled):
    bad = {name: sorted(set(m.group(0) for m in FORBIDDEN.finditer(text))) for name, text in compiled.items()}
    assert not {k: v for k, v in bad.items() if v}, bad


def test_division_and_sqrt_are_correctly_rounded(compiled):
    assert "div.rn.f64" in compiled["unary_fwd_3"]          # sigmoid: 1 / (1 + e^-x) in float64
    assert "sqrt.rn.f64" in compiled["unary_fwd_2"]         # rsqrt: the correctly rounded sqrt
    assert all("div.rn.f32" in compiled[k] for k in ("softmax_fwd", "softmax_fwd_row", "softmax_fwd_causal"))  # 1 / s
    assert "div.rn.f32" in compiled["adamw_bf16"] and "sqrt.rn.f64" in compiled["adamw_bf16"]
    assert "cvt.rn.bf16.f32" in compiled["adamw_bf16"]      # the one rounding to the param dtype: to nearest even


def test_blake3_chunk_loads_whole_blocks_16_bytes_at_a_time(compiled):
    """A program of whole chunks reads each 64-byte block as four 16-byte loads straight into the registers the
    compression reads (statehash._load64), not as a tile whose columns go through shared memory."""
    # four for block 0 before the chunk loop, four in it (each block's loaded during the block before: PREFETCH)
    assert compiled["blake3_chunk_v4"].count("ld.global.v4.u32") == 8
    assert "ld.global.v4.u32" not in compiled["blake3_chunk"]  # the tile loads (VECTOR_LOADS off)
    assert statehash.VECTOR_LOADS and statehash.PREFETCH  # production: 1.16x the tile loads (docs/perf.md's history)


def test_float64_constants_are_the_references_doubles(compiled):
    from kernels.ref import elementary as E

    text = compiled["unary_fwd_0"]
    for v in (E.LOG2E, E.LN2_HI, E.LN2_LO, E._INV_FACT[13], E._INV_FACT[3], 709.9):
        assert _double_hex(v) in text, v
    assert _double_hex(float(struct.unpack("<f", struct.pack("<f", 709.9))[0])) not in text  # a float32-rounded bound


def test_exact_reductions_round_and_truncate_as_the_reference(compiled):
    for name in ("l2_sum", "exactsum_accumulate", "exactsum_result_pending"):
        assert "cvt.rni.f64.f64" in compiled[name], name    # round half to even (torch.round)
    assert "cvt.rzi.s64.f64" in compiled["exactsum_accumulate"]  # the digits by truncation (torch.trunc)
    # the single partial's grid integer + 0.0 (a -0.0 becomes +0.0) survives compilation
    assert re.search(r"add\.rn\.f64\s+%\w+, %\w+, 0d0000000000000000;", compiled["exactsum_result_pending"])
    for c in (2.0 ** 96, 2.0 ** -96, 2.0 ** 80, 2.0 ** -80, 2.0 ** 40, 2.0 ** -40):  # the grid's exact powers
        assert _double_hex(c) in compiled["exactsum_accumulate"] + compiled["exactsum_result_limbs"], c
