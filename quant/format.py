"""The rvq256_256x8 format (the ARVQ write-up, section 2): one (layer, projection)'s cold experts, and its decoder.

Each group of 8 contiguous input columns of an expert weight W [N, K] is

    W[r, 8g:8g+8] = (c0[a] + c1[b]) * (e4m3(scale[r, g // 16]) * global)

with per-expert codebooks c0, c1 of 256 x 8 atoms on the FP4 E2M1 grid, one uint8 index pair (a, b) per
group (16 bits / 8 weights = 2.0 bits/weight), a float8_e4m3fn scale per [row, 128-column block]
(8 bits / 128 weights = 0.0625) and one fp32 global per (layer, projection). Decoding is float32 and
bit-defined: the atom sum is exact (FP4 values add exactly), then one rounding for the scale product and
one for the weight.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from quant.errors import FormatError
from quant.fp_formats import fp4_decode, from_float8_e4m3

NAME = "rvq256_256x8_expert"
GROUP = 8              # input columns per codebook vector
ATOMS = 256            # entries per codebook (one uint8 index)
BOOKS = 2              # additive codebooks c0, c1
SCALE_BLOCK = 128      # input columns per E4M3 block scale
GROUPS_PER_BLOCK = SCALE_BLOCK // GROUP  # 16: the repeat_interleave factor at use
ATOM_BITS = 4          # FP4 E2M1


@dataclass(frozen=True)
class RVQProjection:
    """Cold experts of one (layer, projection): codebooks, index pairs, block scales and the global."""
    codebooks: torch.Tensor    # uint8 [E, 2, 256, 8]: FP4 E2M1 codes of c0 (book 0) and c1 (book 1)
    indices: torch.Tensor      # uint8 [E, N, K/8, 2]: (a, b) per group
    scales: torch.Tensor       # float8_e4m3fn [E, N, K/128]
    global_scale: torch.Tensor  # float32 [] (0-dim)
    experts: tuple[int, ...]   # the model's expert id of each slot

    def __post_init__(self) -> None:
        validate(self)

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) of one expert's weight."""
        return int(self.indices.shape[1]), int(self.indices.shape[2]) * GROUP

    @property
    def n_experts(self) -> int:
        return int(self.indices.shape[0])

    def slot(self, expert: int) -> int:
        """The slot holding a model expert id."""
        try:
            return self.experts.index(expert)
        except ValueError:
            raise FormatError(f"expert {expert} is not among this projection's experts {self.experts}") from None


def validate(p: RVQProjection) -> None:
    """Raise FormatError naming the tensor whose shape or dtype does not fit the format."""
    def need(name, t, dtype, ndim):
        if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.dim() != ndim:
            got = (t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__
            raise FormatError(f"{NAME}: {name} must be a {ndim}-dim {dtype} tensor, got {got}")
    need("codebooks", p.codebooks, torch.uint8, 4)
    need("indices", p.indices, torch.uint8, 4)
    need("scales", p.scales, torch.float8_e4m3fn, 3)
    need("global_scale", p.global_scale, torch.float32, 0)
    e, n, g, two = p.indices.shape
    k = g * GROUP
    if two != BOOKS or k % SCALE_BLOCK:
        raise FormatError(f"{NAME}: indices must be [E, N, K/8, 2] with K a multiple of {SCALE_BLOCK}, "
                          f"got {tuple(p.indices.shape)}")
    if tuple(p.codebooks.shape) != (e, BOOKS, ATOMS, GROUP):
        raise FormatError(f"{NAME}: codebooks must be [{e}, 2, 256, 8], got {tuple(p.codebooks.shape)}")
    if bool((p.codebooks > 15).any()):
        raise FormatError(f"{NAME}: codebooks hold FP4 codes 0..15, found a larger value")
    if tuple(p.scales.shape) != (e, n, k // SCALE_BLOCK):
        raise FormatError(f"{NAME}: scales must be [{e}, {n}, {k // SCALE_BLOCK}], got {tuple(p.scales.shape)}")
    if len(p.experts) != e or len(set(p.experts)) != e:
        raise FormatError(f"{NAME}: experts must name {e} distinct expert ids, got {p.experts}")
    if not bool(torch.isfinite(p.global_scale)):
        raise FormatError(f"{NAME}: global_scale must be finite, got {p.global_scale.item()}")


def atoms(p: RVQProjection) -> torch.Tensor:
    """float32 codebook atoms [E, 2, 256, 8]."""
    return fp4_decode(p.codebooks)


def decode_parts(books: torch.Tensor, idx: torch.Tensor, scales: torch.Tensor,
                 global_scale: torch.Tensor) -> torch.Tensor:
    """One expert's float32 W [R, K] from atoms [2, 256, 8], idx [R, K/8, 2], e4m3 scales [R, K/128]."""
    v = books[0][idx[..., 0].long()] + books[1][idx[..., 1].long()]           # [R, G, 8], exact
    s = from_float8_e4m3(scales) * global_scale                             # [R, K/128], one rounding
    s = s.repeat_interleave(GROUPS_PER_BLOCK, dim=-1)                       # [R, G]
    return (v * s.unsqueeze(-1)).reshape(idx.shape[0], -1)


def decode(p: RVQProjection, slot: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """float32 weight [N, K] of the expert in `slot` (or only `rows` of it)."""
    idx, sc = p.indices[slot], p.scales[slot]
    if rows is not None:
        idx, sc = idx[rows], sc[rows]
    return decode_parts(atoms(p)[slot], idx, sc, p.global_scale)


def decode_all(p: RVQProjection) -> torch.Tensor:
    """float32 weights [E, N, K] of every expert."""
    return torch.stack([decode(p, i) for i in range(p.n_experts)])


def bits_per_weight(n: int, k: int, experts: int = 1) -> dict[str, float]:
    """Exact bits/weight of rvq256_256x8 for E experts of [N, K]: indices, scales, codebooks, global, total."""
    weights = n * k * experts
    parts = {
        "indices": BOOKS * 8 * (n * k // GROUP) * experts,               # two uint8 per group
        "scales": 8 * n * (k // SCALE_BLOCK) * experts,                  # one E4M3 per [row, block]
        "codebooks": BOOKS * ATOMS * GROUP * ATOM_BITS * experts,        # 2 x 256 x 8 FP4 atoms per expert
        "global": 32,                                                    # one fp32 per (layer, projection)
    }
    out = {key: bits / weights for key, bits in parts.items()}
    out["total"] = sum(parts.values()) / weights
    return out
