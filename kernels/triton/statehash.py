"""BLAKE3 on the GPU: the standard digest of a byte stream, so any CPU verifies it with stock blake3.

The stream is cut into BLAKE3's 1 KiB chunks; one lane hashes one chunk (16 compressions of 64-byte
blocks, chunk counter = chunk index); parent nodes are merged level by level, adjacent pairs with an
odd last node carried up, which is exactly BLAKE3's left-complete tree. A program merges an aligned group
of 256 nodes through 8 levels in place (such a group is a subtree of that tree), so a 1 GiB input takes
4 launches (2^20 chunks -> 4096 -> 16 -> 1) and no host synchronization. All arithmetic is uint32 adds,
xors and rotations, so the result is `blake3.blake3(bytes).digest()` on every device. `tensor_digest`
and `digest_many` give kernels.digest's digests without copying tensors to the host.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.launch import cdiv

CHUNK = 1024
LANES = 128  # chunks per program
# BLAKE3's IV (SHA-256's); domain flags used below: CHUNK_START 1, CHUNK_END 2, PARENT 4, ROOT 8
IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
IV0, IV1, IV2, IV3, IV4, IV5, IV6, IV7 = (tl.constexpr(v) for v in IV)


@triton.jit
def _rotr(x, n: tl.constexpr):
    return (x >> n) | (x << (32 - n))


@triton.jit
def _g(a, b, c, d, x, y):
    """BLAKE3's quarter-round G on uint32 lanes."""
    a = a + b + x
    d = _rotr(d ^ a, 16)
    c = c + d
    b = _rotr(b ^ c, 12)
    a = a + b + y
    d = _rotr(d ^ a, 8)
    c = c + d
    b = _rotr(b ^ c, 7)
    return a, b, c, d


@triton.jit
def _round(s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
           m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15):
    """One round: G on the columns, then on the diagonals."""
    s0, s4, s8, s12 = _g(s0, s4, s8, s12, m0, m1)
    s1, s5, s9, s13 = _g(s1, s5, s9, s13, m2, m3)
    s2, s6, s10, s14 = _g(s2, s6, s10, s14, m4, m5)
    s3, s7, s11, s15 = _g(s3, s7, s11, s15, m6, m7)
    s0, s5, s10, s15 = _g(s0, s5, s10, s15, m8, m9)
    s1, s6, s11, s12 = _g(s1, s6, s11, s12, m10, m11)
    s2, s7, s8, s13 = _g(s2, s7, s8, s13, m12, m13)
    s3, s4, s9, s14 = _g(s3, s4, s9, s14, m14, m15)
    return s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15


@triton.jit
def _compress(h0, h1, h2, h3, h4, h5, h6, h7,
              m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15,
              counter_lo, counter_hi, block_len, flags):
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
        m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m2, m6, m3, m10, m7, m0, m4, m13, m1, m11, m12, m5, m9, m14, m15, m8)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m3, m4, m10, m12, m13, m2, m7, m14, m6, m5, m9, m0, m11, m15, m8, m1)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m10, m7, m12, m9, m14, m3, m13, m15, m4, m0, m11, m2, m5, m8, m1, m6)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m12, m13, m9, m11, m15, m10, m14, m8, m7, m2, m5, m3, m0, m1, m6, m4)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m9, m14, m11, m5, m8, m12, m15, m1, m13, m3, m0, m10, m2, m6, m4, m7)
    s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15 = _round(
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11, s12, s13, s14, s15,
        m11, m15, m5, m0, m1, m9, m8, m6, m14, m10, m2, m12, m3, m4, m7, m13)
    return s0 ^ s8, s1 ^ s9, s2 ^ s10, s3 ^ s11, s4 ^ s12, s5 ^ s13, s6 ^ s14, s7 ^ s15


@triton.jit
def _word(w_ptr, idx, mask):
    return tl.load(w_ptr + idx, mask=mask, other=0).to(tl.uint32, bitcast=True)


@triton.jit(do_not_specialize=["n_bytes", "n_chunks"])
def _chunk_kernel(w_ptr, cv_ptr, n_bytes, n_chunks, IS_ROOT: tl.constexpr, LANES: tl.constexpr):
    """Chaining value of each 1 KiB chunk (one chunk per lane); with IS_ROOT, the single chunk's digest."""
    c = tl.program_id(0).to(tl.int64) * LANES + tl.arange(0, LANES)
    live = c < n_chunks
    n_words = (n_bytes + 3) // 4  # the buffer is zero-padded to whole words
    chunk_len = tl.minimum(tl.maximum(n_bytes - c * 1024, 0), 1024)
    n_blocks = tl.maximum((chunk_len + 63) // 64, 1)
    lo = (c & 0xFFFFFFFF).to(tl.uint32)
    hi = (c >> 32).to(tl.uint32)
    h0 = tl.full([LANES], IV0, tl.uint32)
    h1 = tl.full([LANES], IV1, tl.uint32)
    h2 = tl.full([LANES], IV2, tl.uint32)
    h3 = tl.full([LANES], IV3, tl.uint32)
    h4 = tl.full([LANES], IV4, tl.uint32)
    h5 = tl.full([LANES], IV5, tl.uint32)
    h6 = tl.full([LANES], IV6, tl.uint32)
    h7 = tl.full([LANES], IV7, tl.uint32)
    for b in range(16):
        on = live & (b < n_blocks)
        w = c * 256 + b * 16
        ok = on & (w < n_words)  # words past the end are BLAKE3's zero padding
        m0 = _word(w_ptr, w + 0, ok & (w + 0 < n_words))
        m1 = _word(w_ptr, w + 1, ok & (w + 1 < n_words))
        m2 = _word(w_ptr, w + 2, ok & (w + 2 < n_words))
        m3 = _word(w_ptr, w + 3, ok & (w + 3 < n_words))
        m4 = _word(w_ptr, w + 4, ok & (w + 4 < n_words))
        m5 = _word(w_ptr, w + 5, ok & (w + 5 < n_words))
        m6 = _word(w_ptr, w + 6, ok & (w + 6 < n_words))
        m7 = _word(w_ptr, w + 7, ok & (w + 7 < n_words))
        m8 = _word(w_ptr, w + 8, ok & (w + 8 < n_words))
        m9 = _word(w_ptr, w + 9, ok & (w + 9 < n_words))
        m10 = _word(w_ptr, w + 10, ok & (w + 10 < n_words))
        m11 = _word(w_ptr, w + 11, ok & (w + 11 < n_words))
        m12 = _word(w_ptr, w + 12, ok & (w + 12 < n_words))
        m13 = _word(w_ptr, w + 13, ok & (w + 13 < n_words))
        m14 = _word(w_ptr, w + 14, ok & (w + 14 < n_words))
        m15 = _word(w_ptr, w + 15, ok & (w + 15 < n_words))
        block_len = tl.minimum(tl.maximum(chunk_len - b * 64, 0), 64).to(tl.uint32)
        last = b == n_blocks - 1
        flags = tl.where(b == 0, 1, 0) | tl.where(last, 2, 0)  # CHUNK_START, CHUNK_END
        if IS_ROOT:
            flags = flags | tl.where(last, 8, 0)  # ROOT: the whole input is this one chunk
        g0, g1, g2, g3, g4, g5, g6, g7 = _compress(h0, h1, h2, h3, h4, h5, h6, h7,
                                                   m0, m1, m2, m3, m4, m5, m6, m7,
                                                   m8, m9, m10, m11, m12, m13, m14, m15,
                                                   lo, hi, block_len, flags.to(tl.uint32))
        h0, h1, h2, h3 = tl.where(on, g0, h0), tl.where(on, g1, h1), tl.where(on, g2, h2), tl.where(on, g3, h3)
        h4, h5, h6, h7 = tl.where(on, g4, h4), tl.where(on, g5, h5), tl.where(on, g6, h6), tl.where(on, g7, h7)
    out = cv_ptr + c * 8
    tl.store(out + 0, h0.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 1, h1.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 2, h2.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 3, h3.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 4, h4.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 5, h5.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 6, h6.to(tl.int32, bitcast=True), mask=live)
    tl.store(out + 7, h7.to(tl.int32, bitcast=True), mask=live)


GROUP = 256  # tree nodes merged by one program: 8 levels per launch


@triton.jit(do_not_specialize=["n"])
def _group_kernel(cv, out, n, IS_ROOT: tl.constexpr, GROUP: tl.constexpr, LOG_GROUP: tl.constexpr):
    """Levels of the tree over n chaining values, GROUP of them per program merged into one (out[pid]).

    Level by level in place over the program's slice of `cv`: node i = parent(2i, 2i+1), or node 2i carried
    up when it has no right sibling; an aligned power-of-two group is a subtree of BLAKE3's left-complete
    tree, so its levels are the tree's. The merge of the last two nodes of the whole input is the root."""
    g = tl.program_id(0).to(tl.int64)
    base = cv + g * GROUP * 8
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
        flags = zero + (4 | tl.where(cnt == 2, 8 if IS_ROOT else 0, 0)).to(tl.uint32)  # PARENT (| ROOT, last merge)
        g0, g1, g2, g3, g4, g5, g6, g7 = _compress(tl.full([GROUP // 2], IV0, tl.uint32), tl.full([GROUP // 2], IV1, tl.uint32),
                                                   tl.full([GROUP // 2], IV2, tl.uint32), tl.full([GROUP // 2], IV3, tl.uint32),
                                                   tl.full([GROUP // 2], IV4, tl.uint32), tl.full([GROUP // 2], IV5, tl.uint32),
                                                   tl.full([GROUP // 2], IV6, tl.uint32), tl.full([GROUP // 2], IV7, tl.uint32),
                                                   m0, m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14,
                                                   m15, zero, zero, zero + 64, flags)
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
    tl.store(out + g * 8 + w, tl.load(base + w))


def _words(data: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor's bytes as int32 words (zero-padded to a whole word) and the byte count."""
    raw = data.detach().contiguous().reshape(-1).view(torch.uint8)
    n = raw.numel()
    if n % 4 == 0 and raw.data_ptr() % 4 == 0 and n:
        return raw.view(torch.int32), n
    padded = torch.zeros(max(cdiv(n, 4), 1) * 4, dtype=torch.uint8, device=raw.device)
    padded[:n] = raw
    return padded.view(torch.int32), n


def blake3_words(words: torch.Tensor, n_bytes: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """BLAKE3 of the first n_bytes of int32 `words` (zero beyond them), as 8 int32 words on the device
    (written into `out` when given). No host synchronization: launches only."""
    n_chunks = max(cdiv(n_bytes, CHUNK), 1)
    cv = torch.empty(n_chunks * 8, dtype=torch.int32, device=words.device)
    _chunk_kernel[(cdiv(n_chunks, LANES),)](words, cv, n_bytes, n_chunks, IS_ROOT=n_chunks == 1, LANES=LANES)
    n = n_chunks
    while n > 1:
        nxt = torch.empty(cdiv(n, GROUP) * 8, dtype=torch.int32, device=words.device)
        _group_kernel[(cdiv(n, GROUP),)](cv, nxt, n, IS_ROOT=n <= GROUP, GROUP=GROUP,
                                         LOG_GROUP=GROUP.bit_length() - 1, num_warps=4)
        cv, n = nxt, cdiv(n, GROUP)
    if out is None:
        return cv[:8]
    out.copy_(cv[:8])
    return out


def raw_digests(tensors: list[torch.Tensor]) -> list[bytes]:
    """The 32-byte BLAKE3 digest of each tensor's raw bytes, computed on the device, one transfer for all."""
    if not tensors:
        return []
    out = torch.empty((len(tensors), 8), dtype=torch.int32, device=tensors[0].device)
    for i, t in enumerate(tensors):
        words, n = _words(t)
        blake3_words(words, n, out[i])
    host = out.cpu().numpy().astype("<i4")
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
