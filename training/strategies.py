"""One reduction strategy per way a step's ranks exist, each with the same small interface, so that
training/step.py's `run_step` reads straight through:

- `Virtual`: every rank of the topology in this process (the trainer's default and the replay);
- `Replicated`: a real data-parallel group, each rank holding the full state (S = 1): the exact wire
  (collectives/exact_wire.py) bucket by bucket, overlapped with the last local backward (training/overlap.py),
  or the ordered recursive-doubling all-reduce after it;
- `Sharded`: HSDP on a real group (S > 1, training/sharding.py): the reduce-scatter bucket by bucket, overlapped
  likewise; each rank clips and updates its slice.

`plan` (this process's microbatches), `reduce(parts)` (the mean gradient over the step's windows, or my slice of
it; a partial per window), `watch` (sees a microbatch's per-window leaves before its backward, or None), `gather(...)`
(every rank's loss rows, partial digests and loads), `clip`, `update` (AdamW), `settle` (what the state keeps,
and the full tensors the stage digests read), `writer` (whether this rank writes the digests).
"""
from __future__ import annotations

import torch

from training.config import Topology, TrainConfig
from training.errors import ConfigError
from training.optim import adamw_update, clip
from training.overlap import Overlapped, bucket_plan
from training.reduction import ExactSum, exact_across_ranks, ordered_across_ranks, reduce_gradients, uniform_accum, \
    window_coords
from training.sharding import ShardedStep

F32 = torch.float32


def read_partial_digests(partial_digests: list | None) -> list | None:
    """(windows, hex) for (windows, PendingNamed or hex): waits for the queued hashes."""
    if partial_digests is None:
        return None
    return [(w, d if isinstance(d, str) else d.hex()) for w, d in partial_digests]


class Virtual:
    """Every rank of `topology` in this process: the canonical reduction of training/reduction.py."""

    writer = True
    watch = None

    def __init__(self, ctx, topology: Topology, plan: list) -> None:
        self.ctx, self.topology, self.plan = ctx, topology, plan
        self.coords = window_coords(plan)

    def reduce(self, parts) -> dict[str, torch.Tensor]:
        t = self.ctx.cfg.train
        return reduce_gradients(parts, self.topology, self.coords, t.reduction, self.ctx.ops)

    def gather(self, losses: list, partial_digests: list | None, load: dict) -> tuple[list, list | None, dict]:
        return losses, partial_digests, load

    def clip(self, g: dict[str, torch.Tensor], max_norm: float):
        return clip(g, max_norm, self.ctx.ops)

    def update(self, state, clipped, lr: float, t: TrainConfig) -> None:
        adamw_update(state.params, clipped, state.m, state.v, self.ctx.specs, state.adam_step, lr, t, self.ctx.ops)

    def settle(self, state, reduced, clipped) -> tuple[dict, dict]:
        state.grads = clipped
        return reduced, clipped


class Replicated(Virtual):
    """A real group, every rank with the full state: this rank's microbatches, then one cross-rank reduction."""

    def __init__(self, ctx, topology: Topology, plan: list, group, params32: dict) -> None:
        super().__init__(ctx, topology, plan)
        t = ctx.cfg.train
        self.group, self.params32, self.n = group, params32, len(self.coords)
        if t.reduction == "ordered":
            self.accum = uniform_accum(self.coords, topology)  # every rank the same count, before the cut
        me = divmod(group.rank, topology.dp_shard)  # (replica, shard)
        self.plan = [(c, w) for c, w in plan if (c.replica, c.shard) == me]  # possibly none: it adds zeros
        self.run: Overlapped | None = None

    def watch(self, leaves: dict, coords: list) -> None:
        if self.run is not None:
            self.run.watch(leaves, coords)

    def _overlapped(self, parts, reduce_bucket) -> list:
        """`reduce_bucket(sums, names)` of this rank's exact sums, every bucket in order, the buckets reduced as
        the last local backward produces them (training/overlap.py)."""
        sums = {k: ExactSum(tuple(v.shape), v.device, self.ctx.ops) for k, v in self.params32.items()}
        numel = {k: v.numel() for k, v in self.params32.items()}
        # the model spec's order, reversed: the backward's order, and the same on every rank whatever its dict order
        order = [k for k in reversed(list(self.ctx.specs)) if k in numel] + sorted(set(numel) - set(self.ctx.specs))
        buckets = bucket_plan(numel, order, self.ctx.bucket_elements)
        last = window_coords(self.plan[-1:])  # the last microbatch's windows: their gradients go by the hooks
        self.run = Overlapped(numel, buckets, len(window_coords(self.plan)), last, lambda name, g: sums[name].add(g),
                              lambda names: reduce_bucket(sums, names), self.ctx.observer)
        try:
            return self.run.run(parts)
        finally:
            self.run = None

    def reduce(self, parts) -> dict[str, torch.Tensor]:
        if self.ctx.cfg.train.reduction == "ordered":
            return ordered_across_ranks(parts, self.accum, self.topology.dp_replicate, self.group.all_reduce_ordered_)
        outs = self._overlapped(parts, lambda sums, names: exact_across_ranks({k: sums[k] for k in names}, self.n,
                                                                               self.group))
        mean = {k: v for out in outs for k, v in out.items()}
        return {k: mean[k] for k in sorted(mean)}

    def gather(self, losses: list, partial_digests: list | None, load: dict) -> tuple[list, list | None, dict]:
        """Every rank's rows, digests and loads (JSON-able: the group sends them as JSON)."""
        mine = ([(w, x.tolist()) for w, x in losses], read_partial_digests(partial_digests),
                {k: v.tolist() for k, v in load.items()})
        losses, partial_digests, load = [], [] if partial_digests is not None else None, {}
        for rl, rd, rload in self.group.all_gather(mine):
            losses += [(w, torch.tensor(x, dtype=F32)) for w, x in rl]
            if partial_digests is not None:
                partial_digests += rd
            for layer, counts in rload.items():
                c = torch.tensor(counts, dtype=torch.int64)
                load[layer] = load[layer] + c if layer in load else c
        return losses, partial_digests, load


class Sharded(Replicated):
    """HSDP on a real group (training/sharding.py): my slice of the mean gradient, of the clip and of AdamW."""

    def __init__(self, ctx, topology: Topology, plan: list, group, params32: dict, state) -> None:
        if ctx.cfg.train.reduction == "ordered":
            raise ConfigError(f"train.reduction='ordered' with HSDP ({topology.label()}) on real workers: not "
                              f"wired; use 'exact' (the same bits on any mesh) or --dp-shard 1")
        super().__init__(ctx, topology, plan, group, params32)
        self.step = ShardedStep(state, topology.dp_shard, group)
        self.writer = self.step.writer

    def reduce(self, parts) -> torch.Tensor:
        return self.step.mean(self._overlapped(parts, lambda sums, names: self.step.scatter_bucket(sums, names,
                                                                                                    self.n)))

    def clip(self, g: torch.Tensor, max_norm: float):
        return self.step.clip(g, max_norm)

    def update(self, state, clipped, lr: float, t: TrainConfig) -> None:
        self.step.update(state.params, clipped, self.ctx.specs, state.adam_step, lr, t)

    def settle(self, state, reduced, clipped) -> tuple[dict | None, dict]:
        """The writer gathers the full m, v and grads (and the mean for its digest); the others keep slices."""
        reduced = self.step.settle(state, reduced, clipped, self.ctx.cfg.train.stage_digests)
        return reduced, state.grads


def strategy_for(ctx, state, topology: Topology, plan: list, group, params32: dict):
    """The strategy for a step on `topology`: in this process (no group, or a group of one), replicated or sharded
    on `group`."""
    if group is not None and topology.world != group.world:
        raise ConfigError(f"real data parallelism: topology {topology.label()} has {topology.world} ranks, the "
                          f"group {group.world}")
    if group is None or group.world == 1:
        # a group of one exchanges nothing: its rank is the whole topology, as in the one-process trainer (no
        # encode, no collective, no host round trip on the GPU; the same bits, since a sum of one partial is itself)
        strategy = Virtual(ctx, topology, plan)
    else:
        if topology.dp_shard > 1:
            strategy = Sharded(ctx, topology, plan, group, params32, state)
        else:
            strategy = Replicated(ctx, topology, plan, group, params32)
    if state.shard is not None and not isinstance(strategy, Sharded):
        raise ConfigError(f"step {state.step}: this rank holds only a slice of the optimizer state (HSDP); topology "
                          f"{topology.label()} needs the full state: restart from a checkpoint")
    return strategy
