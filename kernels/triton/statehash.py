"""BLAKE3 on the GPU: the standard digest of a byte stream, so any CPU verifies it with stock blake3.

The stream is cut into BLAKE3's 1 KiB chunks; one lane hashes one chunk (16 compressions of 64-byte
blocks, chunk counter = chunk index); parent nodes are merged level by level, adjacent pairs with an
odd last node carried up, which is exactly BLAKE3's left-complete tree. A program merges an aligned group
of 256 nodes through 8 levels in place (such a group is a subtree of that tree). Many tensors are hashed
together: a table says which tensor each program works on, so there is one launch for every chunk and one
per tree level (a 1 GiB tensor: 2^20 chunks -> 4096 -> 16 -> 1) whatever the number of tensors, and no host
synchronization (per-tensor launches left a step's hashing bound by the host's launch rate). All arithmetic is
uint32 adds, xors and rotations, so the result is `blake3.blake3(bytes).digest()` on every device.
`tensor_digest` and `digest_many` give kernels.digest's digests without copying tensors to the host.
"""
from __future__ import annotations

import collections

import torch
import triton
import triton.language as tl

from kernels.triton.launch import INTERPRET, cdiv
from kernels.triton.tables import owner

CHUNK = 1024
LANES = 128  # chunks per program
GROUP = 256  # tree nodes merged by one program: 8 levels per launch
ALIGN = 16  # bytes: every buffer's address, for the chunk kernel's 16-byte loads
# _load64's 16-byte loads for whole programs (1.08x the [LANES, 16] tile on the H200, docs/perf.md's history;
# tests/gpu/test_statehash.py runs every way); never under the interpreter, which runs no PTX
VECTOR_LOADS = True
# each block's words loaded one block ahead, during the previous block's compression: 1.08x more on the H200
# (docs/perf.md's history), 7 registers more
PREFETCH = True
# BLAKE3's IV (SHA-256's); domain flags used below: CHUNK_START 1, CHUNK_END 2, PARENT 4, ROOT 8
IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
IV0, IV1, IV2, IV3, IV4, IV5, IV6, IV7 = (tl.constexpr(v) for v in IV)


@triton.jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@triton.jit
def _g(a, b, c, d, x, y, one):
    """BLAKE3's quarter-round G on uint32 lanes. `one` is 1, unknown to the compiler: a + b + x as two
    multiply-adds (b one + a, x one + a) runs on the FMA pipe instead of the integer ALU, which the xors and
    rotations already fill (the chunk kernel is ALU-bound); uint32 arithmetic wraps the same either way."""
    a = x * one + (b * one + a)
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = y * one + (b * one + a)
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _round(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
           m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, one):
    """One round: G on the columns, then on the diagonals."""
    s0, s4, s8, s12 = _g(s0, s4, s8, s12, m0, m1, one)
    s1, s5, s9, s13 = _g(s1, s5, s9, s13, m2, m3, one)
    s2, s6, s10, s14 = _g(s2, s6, s10, s14, m4, m5, one)
    s3, s7, s11, s15 = _g(s3, s7, s11, s15, m6, m7, one)
    s0, s5, s10, s15 = _g(s0, s5, s10, s15, m8, m9, one)
    s1, s6, s11, s12 = _g(s1, s6, s11, s12, m10, m11, one)
    s2, s7, s8, s13 = _g(s2, s7, s8, s13, m12, m13, one)
    s3, s4, s9, s14 = _g(s3, s4, s9, s14, m14, m15, one)
    return s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15


@triton.jit
def _compress(h0, h1, h2, h3, h4, h5, h6, h7,
              m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
              counter_lo, counter_hi, block_len, flags, one):
    """The compression function's first 8 output words (the chaining value)."""
    s0, s1, s2, s3, s4, s5, s6, s7 = h0, h1, h2, h3, h4, h5, h6, h7
    s8 = tl.full(h0.shape, IV0, tl.uint32)
    s9 = tl.full(h0.shape, IV1, tl.uint32)
    s10 = tl.full(h0.shape, IV2, tl.uint32)
    s11 = tl.full(h0.shape, IV3, tl.uint32)
    s12, s13, s14, s15 = counter_lo, counter_hi, block_len, flags
    # seven rounds; each uses the message words in BLAKE3's permuted order
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, one)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8, one)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m3, m4, m10, m12, m13, m2, m7, m14, m6, m5, m9, m0, m11, m15, m8, m1, one)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m10, m7, m12, m9, m14, m3, m13, m15, m4, m0, m11, m2, m5, m8, m1, m6, one)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m12, m13, m9, m11, m15, m10, m14, m8, m7, m2, m5, m3, m0, m1, m6, m4, one)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m9, m14, m11, m5, m8, m12, m15, m1, m13, m3, m0, m10, m2, m6, m4, m7, one)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m11, m15, m5, m0, m1, m9, m8, m6, m14, m10, m2, m12, m3, m4, m7, m13, one)
    return s0 ^ s8, s1 ^ s9, s2 ^ s10, s3 ^ s11, s4 ^ s12, s5 ^ s13, s6 ^ s14, s7 ^ s15


@triton.jit
def _word(w_ptr, idx, mask):
    return tl.load(w_ptr + idx, mask=mask, other=0).to(tl.uint32, bitcast=True)


@triton.jit
def _columns(x):
    """A [LANES, 16] tile as its 16 columns (each lane's words 0..15), [LANES] each."""
    x = tl.reshape(x.to(tl.uint32, bitcast=True), [x.shape[0], 2, 2, 2, 2])  # word = 8 i + 4 j + 2 k + l
    x0, x1 = tl.split(x)  # named by the bits fixed so far: x{l}, x{k}{l}, x{j}{k}{l}
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
def _load64(addr):
    """The 16 words at each lane's 16-aligned address: four 16-byte loads a lane, straight into the registers
    the compressions read (no [LANES, 16] tile, so no layout change through shared memory and its barriers,
    and one address a block instead of one 64-bit address per word)."""
    return tl.inline_asm_elementwise(
        "ld.global.v4.u32 {$0, $1, $2, $3}, [$16];\n\t"
        "ld.global.v4.u32 {$4, $5, $6, $7}, [$16+16];\n\t"
        "ld.global.v4.u32 {$8, $9, $10, $11}, [$16+32];\n\t"
        "ld.global.v4.u32 {$12, $13, $14, $15}, [$16+48];",
        "=r," * 16 + "l", [addr], dtype=(tl.uint32,) * 16, is_pure=True, pack=1)


@triton.jit
def _block(w_ptr, c, b, n_words, on, full, LANES: tl.constexpr, V4: tl.constexpr):
    """Block b's 16 message words of each lane's chunk, as 16 [LANES] vectors; `full`: every lane's chunk is
    whole, so no word needs its bounds checked.

    V4 (VECTOR_LOADS, on a GPU; the buffers 16-byte aligned, which _plan checks): a whole program's words come in
    16-byte loads (_load64). Otherwise one [LANES, 16] load instead of 16 scalar loads 1 KiB apart across
    lanes: those cost one memory transaction per lane per word and bound the kernel on the load unit (1.06 vs
    0.76 ms a GiB on the H200). The kernel is bound by the integer ALUs, and the bounds' 64-bit compares took
    ~1/6 of their instructions (SASS of the loop: ~755 ALU instructions a block before, ~490 without them and
    with _g's multiply-adds)."""
    if full:
        if V4:
            m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _load64(w_ptr + c * 256 + b * 16)
        else:
            w = c[:, None] * 256 + b * 16 + tl.arange(0, 16)[None, :]
            m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _columns(tl.load(w_ptr + w))
    else:
        w = c[:, None] * 256 + b * 16 + tl.arange(0, 16)[None, :]
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _columns(
            tl.load(w_ptr + w, mask=on[:, None] & (w < n_words), other=0))
    return m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15


@triton.jit(do_not_specialize=["T", "one"])
def _chunk_kernel(table, starts, ws, T, one, TPAD: tl.constexpr, LANES: tl.constexpr, V4: tl.constexpr,
                  PREFETCH: tl.constexpr):
    """Each program: LANES consecutive 1 KiB chunks of one tensor, one chunk per lane, each chunk's chaining
    value written (its digest when it is the whole input). table[t] = (address of the tensor's int32 words,
    byte count, offset of its chunk nodes in ws, 1 if one chunk); chunk counters count from the tensor's start."""
    one = one.to(tl.uint32)  # _g's opaque 1
    p = tl.program_id(0)
    t = owner(starts, p, T, TPAD)
    w_ptr = tl.load(table + t * 4).to(tl.pointer_type(tl.int32))
    n_bytes = tl.load(table + t * 4 + 1)
    dst = tl.load(table + t * 4 + 2)
    root = tl.load(table + t * 4 + 3) != 0
    c_first = (p - tl.load(starts + t)).to(tl.int64) * LANES
    c = c_first + tl.arange(0, LANES)
    full = (c_first + LANES) * 1024 <= n_bytes  # this program's chunks are all whole (most of a large tensor's)
    n_chunks = tl.maximum((n_bytes + 1023) // 1024, 1)
    live = c < n_chunks
    n_words = (n_bytes + 3) // 4  # the buffer is zero-padded to whole words; words past it are BLAKE3's padding
    chunk_len = tl.minimum(tl.maximum(n_bytes - c * 1024, 0), 1024)
    n_blocks = tl.maximum((chunk_len + 63) // 64, 1)
    lo = (c & 0xFFFFFFFF).to(tl.uint32)
    hi = (c >> 32).to(tl.uint32)
    zero = tl.zeros([LANES], tl.uint32)
    h0, h1, h2, h3, h4, h5, h6, h7 = zero + IV0, zero + IV1, zero + IV2, zero + IV3, zero + IV4, zero + IV5, zero + IV6, zero + IV7
    if PREFETCH:
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _block(w_ptr, c, 0, n_words, live,
                                                                                      full, LANES, V4)
    for b in range(16):
        on = live & (b < n_blocks)
        if PREFETCH:  # the next block's words, loaded before this block's compression, which hides their
            # latency (else each block's first G waits for its own loads); the last block reloads itself
            nb = tl.minimum(b + 1, 15)
            n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15 = _block(
                w_ptr, c, nb, n_words, live & (nb < n_blocks), full, LANES, V4)
        else:
            m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = _block(
                w_ptr, c, b, n_words, on, full, LANES, V4)
        block_len = tl.minimum(tl.maximum(chunk_len - b * 64, 0), 64).to(tl.uint32)
        last = b == n_blocks - 1
        flags = tl.where(b == 0, 1, 0) | tl.where(last, 2, 0)  # CHUNK_START, CHUNK_END
        flags = flags | tl.where(last & root, 8, 0)  # ROOT: the whole input is this one chunk
        g0, g1, g2, g3, g4, g5, g6, g7 = _compress(h0, h1, h2, h3, h4, h5, h6, h7,
                                                   m0, m1, m2, m3, m4, m5, m6, m7,
                                                   m8, m9, m10, m11, m12, m13, m14, m15,
                                                   lo, hi, block_len, flags.to(tl.uint32), one)
        h0, h1, h2, h3 = tl.where(on, g0, h0), tl.where(on, g1, h1), tl.where(on, g2, h2), tl.where(on, g3, h3)
        h4, h5, h6, h7 = tl.where(on, g4, h4), tl.where(on, g5, h5), tl.where(on, g6, h6), tl.where(on, g7, h7)
        if PREFETCH:
            m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15 = (
                n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, n10, n11, n12, n13, n14, n15)
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
def _group_kernel(table, starts, ws, T, one, TPAD: tl.constexpr, GROUP: tl.constexpr, LOG_GROUP: tl.constexpr):
    """Each program: an aligned group of GROUP nodes of one tensor's tree level merged into one node, level by
    level in place (node i = parent(2i, 2i+1), or node 2i carried up when it has no right sibling). table[t] =
    (offset of the level's nodes in ws, node count, offset of the next level's, 1 if this is the last level:
    the merge of the last two nodes is then the root). Levels are merged in place rather than in registers:
    unrolled register levels took Triton's coalescing pass minutes to compile."""
    one = one.to(tl.uint32)  # _g's opaque 1
    p = tl.program_id(0)
    t = owner(starts, p, T, TPAD)
    src = tl.load(table + t * 4)
    n = tl.load(table + t * 4 + 1)
    dst = tl.load(table + t * 4 + 2)
    root = tl.load(table + t * 4 + 3) != 0
    g = (p - tl.load(starts + t)).to(tl.int64)
    base = ws + src + g * GROUP * 8
    cnt = tl.minimum(n - g * GROUP, GROUP)  # live nodes at this level
    i = tl.arange(0, GROUP // 2)
    zero = tl.zeros([GROUP // 2], tl.uint32)
    for _ in range(LOG_GROUP):
        live = 2 * i < cnt
        pair = 2 * i + 1 < cnt
        left = base + 2 * i * 8
        m0, m1, m2, m3 = _word(left, 0, live), _word(left, 1, live), _word(left, 2, live), _word(left, 3, live)
        m4, m5, m6, m7 = _word(left, 4, live), _word(left, 5, live), _word(left, 6, live), _word(left, 7, live)
        m8, m9, m10, m11 = _word(left, 8, pair), _word(left, 9, pair), _word(left, 10, pair), _word(left, 11, pair)
        m12, m13, m14 = _word(left, 12, pair), _word(left, 13, pair), _word(left, 14, pair)
        m15 = _word(left, 15, pair)
        flags = zero + (4 | tl.where(root & (cnt == 2), 8, 0)).to(tl.uint32)  # PARENT (| ROOT, last merge)
        g0, g1, g2, g3, g4, g5, g6, g7 = _compress(zero + IV0, zero + IV1, zero + IV2, zero + IV3,
                                                   zero + IV4, zero + IV5, zero + IV6, zero + IV7,
                                                   m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14,
                                                   m15, zero, zero, zero + 64, flags, one)
        tl.debug_barrier()  # every node of this level is read before any is overwritten in place
        node = base + i * 8
        tl.store(node + 0, tl.where(pair, g0, m0).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 1, tl.where(pair, g1, m1).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 2, tl.where(pair, g2, m2).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 3, tl.where(pair, g3, m3).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 4, tl.where(pair, g4, m4).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 5, tl.where(pair, g5, m5).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 6, tl.where(pair, g6, m6).to(tl.int32, bitcast=True), mask=live)
        tl.store(node + 7, tl.where(pair, g7, m7).to(tl.int32, bitcast=True), mask=live)
        tl.debug_barrier()  # the level is written (visible to the whole program) before the next reads it
        cnt = (cnt + 1) // 2
    w = tl.arange(0, 8)
    tl.store(ws + dst + g * 8 + w, tl.load(base + w))


def _words(data: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A tensor whose address holds the bytes as whole words (zero-padded to a whole word), and the byte count.
    The kernels use only the address: a contiguous tensor of whole words at an ALIGN-aligned address (as torch
    allocates) is its own buffer, no views made (making them was most of the host's time per tensor)."""
    n = data.numel() * data.element_size()
    if n and n % 4 == 0 and data.is_contiguous() and data.data_ptr() % ALIGN == 0:
        return data, n
    raw = data.detach().contiguous().reshape(-1).view(torch.uint8)
    if n and n % 4 == 0 and raw.data_ptr() % ALIGN == 0:
        return raw, n  # a contiguous copy: whole words already
    padded = torch.zeros(max(cdiv(n, 4), 1) * 4, dtype=torch.uint8, device=raw.device)
    padded[:n] = raw
    return padded.view(torch.int32), n


Row = tuple[int, int, int, int]  # a tensor's table row in one launch (the kernels' docstrings say what)
PLANS = 8  # launch tables kept (_launch_tables): the state's, a step's stage digests' few sets
_plans: collections.OrderedDict = collections.OrderedDict()


def _plan(buffers: list[tuple[torch.Tensor, int]]) -> tuple[list[list[tuple[Row, int]]], int]:
    """The launches that hash these (words, n_bytes): per launch, per tensor still above one node, its table
    row and its program count; and the workspace size in words. The workspace starts with each tensor's
    8-word digest; every level's nodes follow, and a tensor's last level writes its root into its slot."""
    off = 8 * len(buffers)
    chunks, level = [], []
    for i, (words, n_bytes) in enumerate(buffers):
        ptr = words.data_ptr()
        if ptr % ALIGN:
            raise ValueError(f"digest_words: buffer {i} starts at {ptr:#x}, not {ALIGN}-byte aligned (the chunk "
                             f"kernel loads 16 bytes at a time); pass the tensor through _words")
        nodes = max(cdiv(n_bytes, CHUNK), 1)
        dst = 8 * i if nodes == 1 else off
        chunks.append(((ptr, n_bytes, dst, int(nodes == 1)), cdiv(nodes, LANES)))
        if nodes > 1:
            level.append((i, dst, nodes))
            off += 8 * nodes
    launches = [chunks]
    while level:
        rows, nxt = [], []
        for i, src, n in level:
            nodes = cdiv(n, GROUP)
            dst = 8 * i if nodes == 1 else off
            rows.append(((src, n, dst, int(nodes == 1)), nodes))
            if nodes > 1:
                nxt.append((i, dst, nodes))
                off += 8 * nodes
        launches.append(rows)
        level = nxt
    return launches, off


def _launch_tables(buffers: list[tuple[torch.Tensor, int]], device: torch.device):
    """_plan's launches as one int64 table on the device, each launch's (offset in it, tensors, programs), and
    the workspace size in words. They are a function of the buffers' addresses and sizes alone, so the last
    PLANS are kept by those: the state hash hashes the same tensors, updated in place, every step, and planning
    its 976 tensors at open-1b's 24 layers took ~2 ms of host time with the GPU idle
    (benchmarks/state_hash_cost.py)."""
    key = (device, tuple((w.data_ptr(), n) for w, n in buffers))
    if (hit := _plans.get(key)) is not None:
        _plans.move_to_end(key)
        return hit
    launches, ws_words = _plan(buffers)
    flat, meta = [], []  # every launch's table and program starts in one int64 host list: one transfer
    for launch in launches:
        starts, at = [], 0
        for _, programs in launch:
            starts.append(at)
            at += programs
        meta.append((len(flat), len(launch), at))
        flat += [v for row, _ in launch for v in row] + starts
    # pageable and non-blocking: staged at once, no wait for the GPU's queue; never written after
    _plans[key] = torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True), meta, ws_words
    if len(_plans) > PLANS:
        _plans.popitem(last=False)
    return _plans[key]


def digest_words(buffers: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """BLAKE3 of the first n bytes of each (int32 words, n) on one device (zero beyond them), as [len, 8] int32
    on the device. One launch for all the chunks, then one per tree level of the largest (3 up to 16 GiB): the
    launch count does not grow with the number of tensors. No host synchronization."""
    device = buffers[0][0].device
    tables, meta, ws_words = _launch_tables(buffers, device)
    ws = torch.empty(ws_words, dtype=torch.int32, device=device)  # a fresh one: earlier digests may be unread
    for k, (at, n_t, programs) in enumerate(meta):
        table, starts = tables[at:at + 4 * n_t], tables[at + 4 * n_t:at + 5 * n_t]
        tpad = max(64, triton.next_power_of_2(n_t))  # few variants to compile
        if k == 0:
            _chunk_kernel[(programs,)](table, starts, ws, n_t, 1, TPAD=tpad, LANES=LANES,
                                       V4=VECTOR_LOADS and not INTERPRET, PREFETCH=PREFETCH, num_warps=4)
        else:
            _group_kernel[(programs,)](table, starts, ws, n_t, 1, TPAD=tpad, GROUP=GROUP,
                                       LOG_GROUP=GROUP.bit_length() - 1, num_warps=4)
    return ws[:8 * len(buffers)].view(len(buffers), 8)


def blake3_words(words: torch.Tensor, n_bytes: int) -> torch.Tensor:
    """BLAKE3 of the first n_bytes of int32 `words` (zero beyond them), as 8 int32 words on the device."""
    return digest_words([(words, n_bytes)])[0]


def queue_digests(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The BLAKE3 digest of each tensor's raw bytes as [len, 8] int32 on their device, queued, not waited for.
    The tensors may be freed at once: the hashing is ahead of any later use of their memory on the stream."""
    return digest_words([_words(t) for t in tensors])  # padded copies held until the launches are queued


def raw_digests(tensors: list[torch.Tensor]) -> list[bytes]:
    """The 32-byte BLAKE3 digest of each tensor's raw bytes, computed on the device together: a fixed
    number of launches and one transfer for all of them."""
    if not tensors:
        return []
    host = queue_digests(tensors).cpu().numpy().astype("<i4")
    return [host[i].tobytes() for i in range(len(tensors))]


def blake3_digest(data: torch.Tensor) -> bytes:
    """The 32-byte BLAKE3 digest of a tensor's raw bytes (little-endian, as kernels.digest.tensor_bytes)."""
    words, n = _words(data)
    return blake3_words(words, n).cpu().numpy().astype("<i4").tobytes()


def tensor_digest(t: torch.Tensor) -> str:
    """kernels.digest.tensor_digest computed on the tensor's device: blake3 of "dtype|shape|" + bytes."""
    head = f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode()
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    n = len(head) + raw.numel()
    # one staging buffer: the header shifts every byte of the tensor, so chunks must see it in place
    buf = torch.zeros(cdiv(n, 4) * 4, dtype=torch.uint8, device=t.device)
    buf[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8).to(t.device)
    buf[len(head):n] = raw
    return blake3_words(buf.view(torch.int32), n).cpu().numpy().astype("<i4").tobytes().hex()


def digest_many(named: dict[str, torch.Tensor]) -> str:
    """kernels.digest.digest_many: one blake3 over names and device-computed tensor digests, sorted by name."""
    import blake3  # only the 32-byte digests reach the host

    h = blake3.blake3()
    for name in sorted(named):
        h.update(name.encode() + b"\0" + tensor_digest(named[name]).encode())
    return h.hexdigest()
