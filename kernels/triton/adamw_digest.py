"""AdamW with the state hash's BLAKE3 chunk pass in the same kernel: the step's end state hashed as it is written.

The state hash covers every parameter, both moments and the post-clip gradient, all of which AdamW has in
registers a moment before: hashed by a second kernel they are read from memory again, and the hash's integer
work (BLAKE3 is bound by the integer ALUs) is added to AdamW's memory time instead of overlapping it. Here each
lane owns 512 consecutive elements of one tensor: one 1 KiB chunk of a bf16 parameter, two of each float32
tensor (parameter, gradient, m, v). It walks its span 16 elements at a time, does AdamW on them (the ops of
kernels/triton/adamw.py's `adamw_math`, so the same bits), stores them, and feeds their bytes to its chunks'
compressions. The chunk chaining values go where statehash's plan puts the chunk level, and statehash's tree
launches finish the digests: stock BLAKE3 of each tensor's bytes, what app/digests.raw_digests gives.
All tensors of a step go in one launch (a table, as in statehash), whatever their number.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.ref import adamw as ref
from kernels.triton import statehash
from kernels.triton.adamw import adamw_math, scalars
from kernels.triton.launch import BR_OPTIONS, cdiv, on_triton, to_device
from kernels.triton.statehash import IV0, IV1, IV2, IV3, IV4, IV5, IV6, IV7, _compress, _owner

F32 = torch.float32
SPAN = 512  # elements a lane owns: one bf16 chunk, two float32 chunks
LANES = 128  # lanes a program (4 warps: one lane a thread)
ROW = 10  # table row: param, grad, m, v addresses; n; their four chunk-node offsets in ws; scalar row


@triton.jit
def _words16(x):
    """A [LANES, 16] uint32 tile as its 16 columns, [LANES] each (BLAKE3 message words 0..15)."""
    x = tl.reshape(x, [x.shape[0], 2, 2, 2, 2])  # word = 8 i + 4 j + 2 k + l
    x0, x1 = tl.split(x)
    x00, x10 = tl.split(x0)
    x01, x11 = tl.split(x1)
    x000, x100 = tl.split(x00)
    x010, x110 = tl.split(x10)
    x001, x101 = tl.split(x01)
    x011, x111 = tl.split(x11)
    m0, m8 = tl.split(x000)
    m4, m12 = tl.split(x100)
    m2, m10 = tl.split(x010)
    m6, m14 = tl.split(x110)
    m1, m9 = tl.split(x001)
    m5, m13 = tl.split(x101)
    m3, m11 = tl.split(x011)
    m7, m15 = tl.split(x111)
    return m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15


@triton.jit
def _words8(x):
    """A [LANES, 8] uint32 tile as its 8 columns."""
    x = tl.reshape(x, [x.shape[0], 2, 2, 2])  # word = 4 j + 2 k + l
    x0, x1 = tl.split(x)
    x00, x10 = tl.split(x0)
    x01, x11 = tl.split(x1)
    m0, m4 = tl.split(x00)
    m2, m6 = tl.split(x10)
    m1, m5 = tl.split(x01)
    m3, m7 = tl.split(x11)
    return m0, m1, m2, m3, m4, m5, m6, m7


@triton.jit
def _pairs(x):
    """A [LANES, 16] bf16 tile's bytes as [LANES, 8] little-endian words (elements 2w, 2w+1)."""
    u = x.to(tl.uint16, bitcast=True).to(tl.uint32)
    lo, hi = tl.split(tl.reshape(u, [x.shape[0], 8, 2]))
    return lo | (hi << 16)


@triton.jit
def _block_of(c, b, n_bytes, n_chunks, root):
    """Chunk c's block b of a tensor of n_bytes: (compress it?, its length, its flags), as in statehash."""
    chunk_len = tl.minimum(tl.maximum(n_bytes - c * 1024, 0), 1024)
    n_blocks = tl.maximum((chunk_len + 63) // 64, 1)
    on = (c < n_chunks) & (b < n_blocks)
    last = b == n_blocks - 1
    flags = tl.where(b == 0, 1, 0) | tl.where(last, 2, 0) | tl.where(last & root, 8, 0)
    block_len = tl.minimum(tl.maximum(chunk_len - b * 64, 0), 64)
    return on, block_len.to(tl.uint32), flags.to(tl.uint32)


@triton.jit
def _absorb(h0, h1, h2, h3, h4, h5, h6, h7, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
            c, b, n_bytes, n_chunks, root, one):
    """Compress block b of chunk c (per lane) into the chaining value h, where that block exists."""
    on, block_len, flags = _block_of(c, b, n_bytes, n_chunks, root)
    lo = (c & 0xFFFFFFFF).to(tl.uint32)
    hi = (c >> 32).to(tl.uint32)
    g0, g1, g2, g3, g4, g5, g6, g7 = _compress(h0, h1, h2, h3, h4, h5, h6, h7,
                                               m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
                                               lo, hi, block_len, flags, one)
    return (tl.where(on, g0, h0), tl.where(on, g1, h1), tl.where(on, g2, h2), tl.where(on, g3, h3),
            tl.where(on, g4, h4), tl.where(on, g5, h5), tl.where(on, g6, h6), tl.where(on, g7, h7))


@triton.jit
def _absorb_tile(h0, h1, h2, h3, h4, h5, h6, h7, x, c, b, n_bytes, n_chunks, root, one):
    """_absorb of a [LANES, 16] float32 tile: one whole 64-byte block of each lane's chunk c."""
    m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _words16(x.to(tl.uint32, bitcast=True))
    return _absorb(h0, h1, h2, h3, h4, h5, h6, h7, m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14,
                   m15, c, b, n_bytes, n_chunks, root, one)


@triton.jit
def _store_cv(ws, dst, c, live, h0, h1, h2, h3, h4, h5, h6, h7):
    out = ws + dst + c * 8
    tl.store(out + 0, h0.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 1, h1.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 2, h2.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 3, h3.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 4, h4.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 5, h5.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 6, h6.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 7, h7.to(tl.int32, bitcast=True), mask=live)


@triton.jit(do_not_specialize=["T", "one"])
def _adamw_chunks_kernel(table, starts, k_ptr, ws, T, one, TPAD: tl.constexpr, LANES: tl.constexpr,
                         WIDE: tl.constexpr):
    """Each program: LANES spans of SPAN elements of one tensor (module doc). table[t] (ROW int64s): addresses
    of param, grad, m, v; the element count n; the offsets in ws of the param's, grad's, m's and v's chunk
    nodes (their digest slot when the tensor is one chunk); the row of k_ptr's scalars (9 each) it takes.
    WIDE: the parameters are float32 (else bfloat16)."""
    one = one.to(tl.uint32)  # statehash._g's opaque 1
    pid = tl.program_id(0)
    t = _owner(starts, pid, T, TPAD)
    row = table + t * 10
    p_ptr = tl.load(row + 0).to(tl.pointer_type(tl.float32 if WIDE else tl.bfloat16))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    n = tl.load(row + 4)
    dst_p, dst_g, dst_m, dst_v = tl.load(row + 5), tl.load(row + 6), tl.load(row + 7), tl.load(row + 8)
    k = k_ptr + tl.load(row + 9) * 9
    lane = (pid - tl.load(starts + t)).to(tl.int64) * LANES + tl.arange(0, LANES)
    base = lane * 512
    n4 = n * 4  # bytes of a float32 tensor, and its chunks (one, the root, at most 1 KiB)
    c4 = tl.maximum((n4 + 1023) // 1024, 1)
    r4 = c4 == 1
    if WIDE:
        n2 = n4
    else:
        n2 = n * 2
    c2 = tl.maximum((n2 + 1023) // 1024, 1)
    r2 = c2 == 1
    j = tl.arange(0, 16)[None, :]
    zero = tl.zeros([LANES], tl.uint32)
    p0, p1, p2, p3, p4, p5, p6, p7 = zero + IV0, zero + IV1, zero + IV2, zero + IV3, zero + IV4, zero + IV5, zero + IV6, zero + IV7
    e0, e1, e2, e3, e4, e5, e6, e7 = zero, zero, zero, zero, zero, zero, zero, zero  # a bf16 block's first half
    for q in range(2):  # the lane's float32 chunk 2 lane + q: elements base + 256 q ...
        c = lane * 2 + q
        g0, g1, g2, g3, g4, g5, g6, g7 = zero + IV0, zero + IV1, zero + IV2, zero + IV3, zero + IV4, zero + IV5, zero + IV6, zero + IV7
        m0, m1, m2, m3, m4, m5, m6, m7 = zero + IV0, zero + IV1, zero + IV2, zero + IV3, zero + IV4, zero + IV5, zero + IV6, zero + IV7
        v0, v1, v2, v3, v4, v5, v6, v7 = zero + IV0, zero + IV1, zero + IV2, zero + IV3, zero + IV4, zero + IV5, zero + IV6, zero + IV7
        if WIDE:
            p0, p1, p2, p3, p4, p5, p6, p7 = zero + IV0, zero + IV1, zero + IV2, zero + IV3, zero + IV4, zero + IV5, zero + IV6, zero + IV7
        for b in range(16):  # block b of those chunks: 16 elements; with the next b, block 8 q + b // 2 of the bf16
            offs = base[:, None] + q * 256 + b * 16 + j
            mask = offs < n
            p = tl.load(p_ptr + offs, mask=mask, other=0.0)
            gr = tl.load(g_ptr + offs, mask=mask, other=0.0)
            mo = tl.load(m_ptr + offs, mask=mask, other=0.0)
            ve = tl.load(v_ptr + offs, mask=mask, other=0.0)
            p, mo, ve = adamw_math(p.to(tl.float32), gr, mo, ve, k)
            p = p.to(p_ptr.dtype.element_ty)  # the one rounding to the parameter's dtype
            tl.store(m_ptr + offs, mo, mask=mask)
            tl.store(v_ptr + offs, ve, mask=mask)
            tl.store(p_ptr + offs, p, mask=mask)
            # bytes past the tensor's end are BLAKE3's zero padding (masked lanes computed from zeros)
            g0, g1, g2, g3, g4, g5, g6, g7 = _absorb_tile(g0, g1, g2, g3, g4, g5, g6, g7, tl.where(mask, gr, 0.0),
                                                          c, b, n4, c4, r4, one)
            m0, m1, m2, m3, m4, m5, m6, m7 = _absorb_tile(m0, m1, m2, m3, m4, m5, m6, m7, tl.where(mask, mo, 0.0),
                                                          c, b, n4, c4, r4, one)
            v0, v1, v2, v3, v4, v5, v6, v7 = _absorb_tile(v0, v1, v2, v3, v4, v5, v6, v7, tl.where(mask, ve, 0.0),
                                                          c, b, n4, c4, r4, one)
            p = tl.where(mask, p, 0.0)
            if WIDE:
                p0, p1, p2, p3, p4, p5, p6, p7 = _absorb_tile(p0, p1, p2, p3, p4, p5, p6, p7, p, c, b, n4, c4, r4,
                                                              one)
            else:  # a bf16 block is 32 elements: its words 0..7 from an even b, 8..15 from the odd b after it
                w0, w1, w2, w3, w4, w5, w6, w7 = _words8(_pairs(p))
                if b % 2 == 0:
                    e0, e1, e2, e3, e4, e5, e6, e7 = w0, w1, w2, w3, w4, w5, w6, w7
                else:
                    p0, p1, p2, p3, p4, p5, p6, p7 = _absorb(p0, p1, p2, p3, p4, p5, p6, p7,
                                                             e0, e1, e2, e3, e4, e5, e6, e7,
                                                             w0, w1, w2, w3, w4, w5, w6, w7,
                                                             lane, q * 8 + b // 2, n2, c2, r2, one)
        live = c < c4
        _store_cv(ws, dst_g, c, live, g0, g1, g2, g3, g4, g5, g6, g7)
        _store_cv(ws, dst_m, c, live, m0, m1, m2, m3, m4, m5, m6, m7)
        _store_cv(ws, dst_v, c, live, v0, v1, v2, v3, v4, v5, v6, v7)
        if WIDE:
            _store_cv(ws, dst_p, c, live, p0, p1, p2, p3, p4, p5, p6, p7)
    if not WIDE:
        _store_cv(ws, dst_p, lane, lane < c2, p0, p1, p2, p3, p4, p5, p6, p7)


def _takes(param: torch.Tensor, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> bool:
    """The fused kernel's layout: contiguous, float32 grad and moments, bf16 or float32 parameter, one shape."""
    ts = (param, grad, m, v)
    return on_triton(*ts) and all(t.is_contiguous() for t in ts) and param.dtype in (torch.bfloat16, F32) \
        and grad.dtype == m.dtype == v.dtype == F32 and param.shape == grad.shape == m.shape == v.shape


def adamw_digests(groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float]], *, step: int,
                  lr: float, beta1: float = 0.9, beta2: float = 0.95, eps: float = 1e-8) -> torch.Tensor | None:
    """One AdamW step in place on each (param, grad, m, v, weight_decay), the bits of kernels.ref.adamw, and the
    raw BLAKE3 digest of each updated param, the grad, each updated m and v: [4 * len, 8] int32 on the device,
    rows (param, grad, m, v) per group, queued (no host synchronization). None (and nothing done) when a
    group's tensors are empty or not the kernel's layout (_takes) or the scalars are not AdamW's: the caller then runs
    AdamW and hashes as before."""
    if not groups or isinstance(step, bool) or not isinstance(step, int) or step < 1 \
            or not all(_takes(*g[:4]) and g[0].numel() for g in groups):
        return None
    for name, val, lo, hi, lo_open, hi_open in (("lr", lr, 0.0, float("inf"), False, True),
                                                ("beta1", beta1, 0.0, 1.0, False, True),
                                                ("beta2", beta2, 0.0, 1.0, False, True),
                                                ("eps", eps, 0.0, float("inf"), True, True)):
        ref._check_scalar(name, val, lo, hi, lo_open, hi_open)
    for g in groups:
        ref._check_scalar("weight_decay", g[4], 0.0, float("inf"), False, True)
    device = groups[0][0].device
    decays = sorted({float(g[4]).hex() for g in groups})
    k = to_device(torch.cat([scalars(beta1, beta2, eps, lr, float.fromhex(wd), step) for wd in decays]), device)
    buffers = [(t, t.numel() * t.element_size()) for g in groups for t in g[:4]]

    def leaves(ws: torch.Tensor, dsts: list[int]) -> None:
        for wide in (False, True):
            mine = [(i, g) for i, g in enumerate(groups) if (g[0].dtype == F32) == wide]
            if not mine:
                continue
            flat, starts, at = [], [], 0
            for i, (p, gr, m, v, wd) in mine:
                flat += [p.data_ptr(), gr.data_ptr(), m.data_ptr(), v.data_ptr(), p.numel(),
                         *dsts[4 * i:4 * i + 4], decays.index(float(wd).hex())]
                starts.append(at)
                at += cdiv(cdiv(p.numel(), SPAN), LANES)
            table = torch.tensor(flat + starts, dtype=torch.int64).to(device, non_blocking=True)
            tpad = max(64, triton.next_power_of_2(len(mine)))
            _adamw_chunks_kernel[(at,)](table[:ROW * len(mine)], table[ROW * len(mine):], k, ws, len(mine), 1,
                                        TPAD=tpad, LANES=LANES, WIDE=wide, num_warps=4, **BR_OPTIONS)

    with torch.no_grad():
        return statehash.digest_words(buffers, leaves=leaves)
