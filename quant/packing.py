"""MMA-fragment index tiles (64 uint32 words per tile) and FP4 nibble packing of the codebooks.

Tile layout (layout version 1). A tile covers 16 weight rows x 8 groups (64 input columns): 128 index
pairs = 256 bytes = 64 uint32 words. Tiles are stored [E, N/16, K/64, 64], so a k-loop over one 16-row
strip reads consecutive tiles. Inside a tile, lane l of a warp (gid = l // 4, tig = l % 4) owns the rows
an m16n8k16 A-fragment gives it, gid and gid + 8, and groups tig and tig + 4 of them: 4 groups =
32 weights, its exact share of the 16 x 64 tile. The lane reads words 2l and 2l + 1 (one 64-bit load;
the warp reads the tile's 256 bytes contiguously):

    word 2l     bytes 0..3 = a of (gid, tig), (gid, tig+4), (gid+8, tig), (gid+8, tig+4)
    word 2l + 1 bytes 0..3 = b of the same four groups, same order

Bytes are little-endian within a word (byte j = bits 8j..8j+7). Integer ops only.
"""
from __future__ import annotations

import torch

from quant.errors import FormatError
from quant.format import BOOKS, GROUP

TILE_ROWS = 16
TILE_GROUPS = 8
TILE_WORDS = 64
LANES = 32


def _tile_order() -> torch.Tensor:
    """For each of a tile's 256 bytes in word-major order, its flat (row, group, book) position."""
    pos = []
    for lane in range(LANES):
        gid, tig = lane // 4, lane % 4
        for book in range(BOOKS):
            for j in range(4):
                row, grp = gid + 8 * (j >> 1), tig + 4 * (j & 1)
                pos.append((row * TILE_GROUPS + grp) * BOOKS + book)
    return torch.tensor(pos, dtype=torch.int64)


_ORDER = _tile_order()
_INVERSE = torch.argsort(_ORDER)  # a permutation: its inverse places bytes back


def _check(name: str, indices: torch.Tensor) -> tuple[int, int, int]:
    if indices.dtype != torch.uint8 or indices.dim() != 4 or indices.shape[-1] != BOOKS:
        raise FormatError(f"pack_tiles: {name} must be uint8 [E, N, K/8, 2], got {indices.dtype} "
                          f"{tuple(indices.shape)}")
    e, n, g, _ = indices.shape
    if n % TILE_ROWS or g % TILE_GROUPS:
        raise FormatError(f"pack_tiles: {name} needs N % {TILE_ROWS} == 0 and K % {TILE_GROUPS * GROUP} == 0, "
                          f"got N={n}, K={g * GROUP}")
    return e, n, g


def pack_tiles(indices: torch.Tensor, name: str = "indices") -> torch.Tensor:
    """uint8 index pairs [E, N, K/8, 2] -> uint32 tiles [E, N/16, K/64, 64]."""
    e, n, g = _check(name, indices)
    t = indices.reshape(e, n // TILE_ROWS, TILE_ROWS, g // TILE_GROUPS, TILE_GROUPS, BOOKS)
    t = t.permute(0, 1, 3, 2, 4, 5).reshape(e, n // TILE_ROWS, g // TILE_GROUPS, -1)   # tile-local (row, grp, book)
    b = t.index_select(-1, _ORDER.to(t.device)).to(torch.int64)
    b = b.reshape(*b.shape[:-1], TILE_WORDS, 4)
    words = b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)
    return words.to(torch.uint32)


def unpack_tiles(tiles: torch.Tensor, name: str = "index_tiles") -> torch.Tensor:
    """uint32 tiles [E, N/16, K/64, 64] -> uint8 index pairs [E, N, K/8, 2]."""
    if tiles.dtype != torch.uint32 or tiles.dim() != 4 or tiles.shape[-1] != TILE_WORDS:
        raise FormatError(f"unpack_tiles: {name} must be uint32 [E, N/16, K/64, 64], got {tiles.dtype} "
                          f"{tuple(tiles.shape)}")
    e, nt, gt, _ = tiles.shape
    w = tiles.to(torch.int64)
    b = torch.stack([(w >> s) & 0xFF for s in (0, 8, 16, 24)], dim=-1).reshape(e, nt, gt, -1)
    t = b.index_select(-1, _INVERSE.to(b.device)).to(torch.uint8)
    t = t.reshape(e, nt, gt, TILE_ROWS, TILE_GROUPS, BOOKS).permute(0, 1, 3, 2, 4, 5)
    return t.reshape(e, nt * TILE_ROWS, gt * TILE_GROUPS, BOOKS).contiguous()


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """FP4 codes uint8 [..., 2m] (0..15) -> bytes [..., m]: even element in the low nibble."""
    if codes.dtype != torch.uint8 or codes.shape[-1] % 2 or bool((codes > 15).any()):
        raise FormatError(f"pack_nibbles: codes must be uint8 0..15 with an even last dim, got {codes.dtype} "
                          f"{tuple(codes.shape)}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., m] -> FP4 codes uint8 [..., 2m]."""
    if packed.dtype != torch.uint8:
        raise FormatError(f"unpack_nibbles: packed must be uint8, got {packed.dtype}")
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)
