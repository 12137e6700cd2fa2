"""HSDP on real ranks (dp_replicate x dp_shard, dp_shard > 1): the flat layout, a rank's slice, the sharded norm.

Flat layout: the parameters in sorted name order, each flattened in C order, concatenated into one vector of N
elements. Shard s of a replica owns [lo, hi) = collectives.shard_bounds(N, dp_shard)[s] (torch.tensor_split's
sizes, the collectives' own split); a slice may cut through tensors, so it is a list of `Piece`s.

Mesh: rank = replica * dp_shard + shard. A rank's replica group holds the dp_shard ranks of its replica (group
rank = shard), its shard group the dp_replicate ranks that own the same slice (group rank = replica); both are
collectives.CollectiveGroup-like (reduce_scatter, all_gather, gather, all_reduce_, all_reduce_max_).

A step (`ShardedStep`, driven by training/step.py):
- `scatter_bucket` (per bucket of whole tensors, as the backward produces them: training/overlap.py) and `mean`:
  every rank's exact sums meet on the compact exact wire's reduce-scatter (collectives/exact_scatter.py: about 8
  bytes an element, reduce-scattered in the replica group to the owners of the elements, then summed in the
  shard group), so the owner holds ExactSum.result's bits of the sum over every rank: its slice of the mean
  gradient is the same slice of the one-process mean (the bucketing changes which elements share a message,
  never an element's sum);
- `clip`: kernels.ref.reduce.global_l2_norm's bits from the slices (`sharded_l2_norm`): one all-reduce MAX of
  the largest square (the one fixed-point scale), then SUMs of the int64 sum and the non-finite stand-in;
- `update`: AdamW (elementwise) on this rank's slice of params, m and v, piece by piece with each tensor's
  weight decay, then the parameters are all-gathered in the replica group (float32: bf16 round-trips exactly);
- `settle`: what the state holds afterwards (below).

What a rank holds (TrainState) after a sharded step: the full parameters everywhere (the next forward needs
them). Rank 0, the writer, hashes, logs and checkpoints every step, so it gathers the full m, v and post-clip
gradients from its replica every step (and the pre-clip mean for the `reduced` digest). Every other rank keeps
only its slices of those in `state.shard` (a `Shard`) and empty state.m, v, grads: its state can be neither
hashed (training/state_hash.py refuses it) nor checkpointed, and it continues only on the same mesh. A restart
loads the full checkpoint on every rank and slices it again.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from training.config import TrainConfig
from training.errors import ConfigError
from training.optim import adamw_tensor
from training.params import ParamSpec
from training.reduction import ExactSum
from collectives.exact_scatter import compact_exact_reduce_scatter
from collectives.reduce_scatter import shard_bounds
from kernels.ref import fixed
from kernels.ref.adamw import clip_coefficient
from kernels.ref.reduce import l2_fixed_sum, l2_max_square, l2_norm_from_fixed, l2_squares

F32 = torch.float32


@dataclass(frozen=True)
class Piece:
    """Elements [lo, hi) of the flattened tensor `name`, at offset `at` of a rank's slice."""

    name: str
    lo: int
    hi: int
    at: int


@dataclass(frozen=True)
class FlatLayout:
    """Tensors in sorted name order, flattened and concatenated (module doc)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # where each tensor starts in the flat vector, then N

    @classmethod
    def of(cls, tensors: dict[str, torch.Tensor]) -> "FlatLayout":
        names = tuple(sorted(tensors))
        offsets = [0]
        for k in names:
            offsets.append(offsets[-1] + tensors[k].numel())
        return cls(names, tuple(tuple(tensors[k].shape) for k in names), tuple(offsets))

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    def bounds(self, shard: int, dp_shard: int) -> tuple[int, int]:
        """[lo, hi) of the flat vector that shard `shard` of `dp_shard` owns."""
        return shard_bounds(self.numel, dp_shard)[shard]

    def pieces(self, lo: int, hi: int) -> list[Piece]:
        """The tensor pieces that make up [lo, hi), in order."""
        out = []
        for k, a, b in zip(self.names, self.offsets, self.offsets[1:]):
            s, e = max(a, lo), min(b, hi)
            if s < e:
                out.append(Piece(k, s - a, e - a, s - lo))
        return out

    def take(self, tensors: dict[str, torch.Tensor], lo: int, hi: int) -> torch.Tensor:
        """A float32 copy of [lo, hi) of the flat vector of `tensors` (bf16 widens exactly)."""
        parts = [tensors[p.name].reshape(-1)[p.lo:p.hi].to(F32) for p in self.pieces(lo, hi)]
        device = next(iter(tensors.values())).device
        return torch.cat(parts) if parts else torch.zeros(0, dtype=F32, device=device)

    def put(self, flat: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Write the full flat vector into `tensors` in place (each cast to its dtype: exact for bf16 values)."""
        for k, a, b in zip(self.names, self.offsets, self.offsets[1:]):
            tensors[k].view(-1).copy_(flat[a:b])

    def split(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """The full flat vector as new tensors of the layout's shapes, in sorted name order."""
        return {k: flat[a:b].reshape(s).clone()
                for k, s, a, b in zip(self.names, self.shapes, self.offsets, self.offsets[1:])}


@dataclass
class Shard:
    """A rank's slice [lo, hi) of the flat m, v and post-clip gradients (float32), when it holds no more."""

    lo: int
    hi: int
    m: torch.Tensor
    v: torch.Tensor
    grads: torch.Tensor


def sharded_l2_norm(g: torch.Tensor, numel: int, group) -> torch.Tensor:
    """global_l2_norm's bits over a whole gradient of `numel` elements, from this rank's slice `g` of it.

    `group` holds every slice once (all_reduce_max_, all_reduce_ for sums); max and integer sums are order-free."""
    sq = l2_squares([g], "sharded_l2_norm")
    amax = group.all_reduce_max_(l2_max_square(sq, g.device))
    s = fixed.scale_exponent(amax, numel)
    total, bad = l2_fixed_sum(sq, s)
    group.all_reduce_(total)
    group.all_reduce_(bad)  # 0, +inf or NaN stand-ins (squares are >= 0)
    return l2_norm_from_fixed(total, s, bad)


class ShardedStep:
    """One step of HSDP on this rank (module doc): its slice, its two groups, its slices of m and v."""

    def __init__(self, state, dp_shard: int, group) -> None:
        self.replica, self.across = group.mesh(dp_shard)  # my replica's ranks; the ranks owning my slice
        self.writer = group.rank == 0
        self.layout = FlatLayout.of(state.params)
        self.lo, self.hi = self.layout.bounds(self.replica.rank, dp_shard)
        self.pieces = self.layout.pieces(self.lo, self.hi)
        held = state.shard
        if held is None:  # the full state (fresh, resumed, or the writer's): take my slice of it
            self.m, self.v = self.layout.take(state.m, self.lo, self.hi), self.layout.take(state.v, self.lo, self.hi)
        elif (held.lo, held.hi) == (self.lo, self.hi):
            self.m, self.v = held.m, held.v
        else:
            raise ConfigError(f"HSDP: this rank holds slice [{held.lo}, {held.hi}) of the optimizer state, the mesh "
                              f"now gives it [{self.lo}, {self.hi}); restart from a checkpoint to re-shard")

    def scatter_bucket(self, sums: dict[str, ExactSum], names: tuple[str, ...],
                       n: int) -> list[tuple[Piece, torch.Tensor]]:
        """The bucket of whole tensors `names`, summed over every rank of the mesh and times 1/n, where it falls in
        my slice: (my piece, its float32 mean) pairs, on the compact exact wire's reduce-scatter."""
        shards = self.replica.world
        wire = {k: sums[k].wire() for k in names}
        per_rank = [self._bucket_pieces(names, r, shards) for r in range(shards)]
        parts = [[(wire[p.name][0][:, p.lo:p.hi], None if wire[p.name][1] is None else wire[p.name][1][p.lo:p.hi])
                  for p in pieces] for pieces in per_rank]
        outs, _ = compact_exact_reduce_scatter(parts, self.replica, self.across, 1.0 / n)
        return list(zip(per_rank[self.replica.rank], outs))

    def _bucket_pieces(self, names: tuple[str, ...], shard: int, shards: int) -> list[Piece]:
        """The pieces of tensors `names` that shard `shard` owns (flat layout order), `at` in its slice."""
        lo, hi = self.layout.bounds(shard, shards)
        return [p for p in self.layout.pieces(lo, hi) if p.name in names]

    def mean(self, buckets: list[list[tuple[Piece, torch.Tensor]]]) -> torch.Tensor:
        """My slice of the mean gradient from every bucket's `scatter_bucket` (together they cover it once)."""
        out = torch.empty(self.hi - self.lo, dtype=F32, device=self.m.device)
        for pieces in buckets:
            for p, x in pieces:
                out[p.at:p.at + p.hi - p.lo] = x
        return out

    def clip(self, g: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(global pre-clip norm, clip coefficient, my slice times it): training/optim.clip's bits, sliced."""
        norm = sharded_l2_norm(g, self.layout.numel, self.replica)
        coef = clip_coefficient(norm, max_norm)
        return norm, coef, g * coef

    def update(self, params: dict[str, torch.Tensor], g: torch.Tensor, specs: dict[str, ParamSpec], step: int,
               lr: float, cfg: TrainConfig) -> None:
        """AdamW on my slice of params, m and v; then every rank of the replica gets the full parameters."""
        with torch.no_grad():  # float32 masters are the step's autograd leaves themselves (.to(F32) is a no-op)
            for p in self.pieces:
                a, b = p.at, p.at + p.hi - p.lo
                # a view of the tensor: adamw_tensor updates the parameter in place
                adamw_tensor(params[p.name].view(-1)[p.lo:p.hi], g[a:b], self.m[a:b], self.v[a:b], specs[p.name],
                             step, lr, cfg)
            full = self.replica.all_gather(self.layout.take(params, self.lo, self.hi), self.layout.numel)
            self.layout.put(full, params)

    def settle(self, state, reduced: torch.Tensor, clipped: torch.Tensor,
               want_reduced: bool) -> dict[str, torch.Tensor] | None:
        """Gather m, v, the post-clip gradients (and, if wanted, the mean gradient) to the writer; keep slices
        elsewhere (module doc). Returns the full mean gradient on the writer when wanted, else None."""
        send = {"m": self.m, "v": self.v, "grads": clipped, **({"reduced": reduced} if want_reduced else {})}
        got = {}
        if self.across.rank == 0:  # replica 0 holds the writer; the other replicas hold copies of its slices
            got = {k: self.replica.gather(x, self.layout.numel, dst=0) for k, x in send.items()}
        if not self.writer:
            state.m, state.v, state.grads = {}, {}, {}
            state.shard = Shard(self.lo, self.hi, self.m, self.v, clipped)
            return None
        self.layout.put(got["m"], state.m)
        self.layout.put(got["v"], state.v)
        state.grads = self.layout.split(got["grads"])
        state.shard = None
        return self.layout.split(got["reduced"]) if want_reduced else None
