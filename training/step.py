"""The one training step, used by the trainer and (later) by the replay: a step on a virtual topology.

For each microbatch in mesh order (replica-major, shard-minor, then accumulation), forward and backward
with kernels ops on the float32 widening of the masters; the partial gradients stream into the canonical
reduction (training/reduction.py); then the pre-clip norm, the clip, the spike protocol and AdamW. Rank
r = replica * dp_shard + shard owns window m iff m mod world == r (stream.windows_for); its windows are
cut into `accum` microbatches of `micro_batch` consecutive owned windows. One process thus computes the
bits a cluster of that shape computes.

Stage digests (the hash log's `digests`, what a replay uses to say which stage diverged): `forward`, the
microbatches' float32 (loss, ce, z) rows sorted by their windows; `backward`, blake3 over
"windows:named_digest(partial gradients);" sorted by windows; `reduced` and `clipped`, named_digest of the
reduced and post-clip gradients; `optimizer`, named_digest of the updated parameters and both moments
(kernels/digest.py). Keyed by windows, not mesh position, they name the same work under any topology. The raw
tensor digests behind `clipped` and `optimizer` are the end state's: the result's `memo` hands them to the
state hash, so a step hashes each tensor's bytes once.

Real data parallelism (training/ray_train.py): `run_step(..., group=g)` with a real group of g.world ranks and a
topology R x S with R * S == g.world; this process (rank r = replica * S + shard) computes only the
microbatches of rank r into exact int64 accumulators. With S = 1 they are summed across ranks on the compact
exact wire (collectives/exact_wire.py: integer all-reduces, order-free, about 8 bytes an element for every tensor
in one flat buffer), so every rank holds the bits the one-process virtual topology computes, and every rank clips
and runs AdamW on the full tensors. With S > 1 (HSDP, training/sharding.py) they are reduce-scattered
to the shard owners of each replica and summed across replicas; each owner clips its slice with the global
norm (global_l2_norm's bits) and updates its slice of parameters and moments; the parameters are all-gathered
in the replica. Rank 0 then holds the full state (m, v and grads gathered to it); every other rank holds full
parameters and only its slice of m, v and grads (`state.shard`), and returns no stage digests. Either way the
per-microbatch loss rows, partial digests and expert loads are gathered to every rank, so rank 0 logs the
digests of the one-process run on the same virtual topology. With `ordered` reduction (S = 1 only) each rank
folds its microbatches in order and the ranks' means meet in collectives' recursive-doubling all-reduce, whose
bits are TreeFold's: the bits of the virtual topology R x 1, 4 bytes an element on the wire.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import blake3
import torch

import stream
from training.config import RunConfig, Topology
from kernels.digest import DigestMemo, PendingNamed, named_digest, tensor_digest
from training.errors import ConfigError
from training.model import forward, rope_for
from training.optim import SpikeState, adamw_update, clip, spike_decision
from training.params import ParamSpec, spec_map
from training.reduction import (Coord, exact_across_ranks, exact_sums, ordered_across_ranks, reduce_gradients,
                                uniform_accum)
from training.sharding import Shard, ShardedStep
from kernels.ref.reduce import exact_mean

F32 = torch.float32


@dataclass
class TrainState:
    """Everything a step changes: masters, moments, last post-clip grads, Adam and spike counters, cursors."""

    params: dict[str, torch.Tensor]
    m: dict[str, torch.Tensor]
    v: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    adam_step: int = 0  # applied optimizer updates (AdamW's bias-correction t)
    spike: SpikeState = field(default_factory=SpikeState)
    step: int = 0  # the next step to run
    tokens: int = 0  # training tokens consumed
    shard: Shard | None = None  # HSDP, ranks other than 0: only this slice of m, v, grads (training/sharding.py)

    @classmethod
    def fresh(cls, params: dict[str, torch.Tensor]) -> "TrainState":
        zeros = {k: torch.zeros(v.shape, dtype=F32, device=v.device) for k, v in params.items()}
        return cls(params, {k: t.clone() for k, t in zeros.items()}, {k: t.clone() for k, t in zeros.items()},
                   {k: t.clone() for k, t in zeros.items()})


@dataclass
class StepResult:
    step: int
    windows: tuple[int, int]
    topology: str
    accum: int  # the step's microbatches over all ranks (with micro_batch 1: its windows, on any world)
    loss: float
    ce: float
    z: float
    grad_norm: float
    clip_coef: float
    lr: float
    applied: bool
    triggered: bool
    digests: dict[str, str]
    digest_seconds: float
    expert_load: dict[str, list[int]]
    memo: DigestMemo | None = field(default=None, compare=False, repr=False)  # for state_hash(..., memo)


@dataclass(frozen=True)
class StepContext:
    """What every step of a run shares: config, parameter specs, schedules, RoPE tables, device."""

    cfg: RunConfig
    specs: dict[str, ParamSpec]
    batch: stream.BatchSchedule
    lr: stream.LRSchedule
    rope: tuple[torch.Tensor, torch.Tensor]
    device: torch.device
    backend: str = "ref"  # the op namespace (kernels.backend): the speed changes, the bits do not
    ops: object = None

    @classmethod
    def build(cls, cfg: RunConfig, device: torch.device | str = "cpu", backend: str = "ref") -> "StepContext":
        import kernels

        batch, lr = schedules(cfg)
        dev = torch.device(device)
        return cls(cfg, spec_map(cfg.model), batch, lr, rope_for(cfg.model, dev), dev, backend,
                   kernels.backend(backend))


def schedules(cfg: RunConfig) -> tuple[stream.BatchSchedule, stream.LRSchedule]:
    """The run's batch ramp and token-anchored LR schedule (stream.schedule)."""
    t = cfg.train
    batch = stream.BatchSchedule(cfg.model.seq_len, tuple(stream.BatchPhase(u, w) for u, w in t.batch_phases))
    lr = stream.LRSchedule(t.lr_peak, t.lr_warmup_tokens, t.lr_budget_tokens, t.lr_final_fraction)
    return batch, lr


def microbatch_plan(step: int, topology: Topology, micro_batch: int,
                    batch: stream.BatchSchedule) -> list[tuple[Coord, list[int]]]:
    """[(coord, window indices)] of `step` on `topology`, in mesh order (replica-major, shard-minor, then the
    rank's microbatches): rank r's windows (m mod world == r) cut into runs of `micro_batch`, the last run shorter
    where they do not divide. Ranks may own different numbers of windows, or none (then no microbatch)."""
    plan = []
    for rank in range(topology.world):
        owned = list(stream.windows_for(step, rank, topology.world, batch))
        replica, shard = divmod(rank, topology.dp_shard)
        for i in range(0, len(owned), micro_batch):
            plan.append((Coord(replica, shard, i // micro_batch), owned[i:i + micro_batch]))
    return plan


def weights(plan: list[tuple[Coord, list[int]]]) -> list[int]:
    """How many times each microbatch's gradient enters the step's sum: once each when every microbatch holds as
    many windows (the mean over microbatches is then the mean over windows), else its window count (the exact
    sum takes a partial w times exactly), so that every window weighs the same."""
    sizes = [len(w) for _, w in plan]
    return [1] * len(plan) if len(set(sizes)) <= 1 else sizes


class _HashClock:
    """Seconds spent on queued hashes (the partial gradients, the stage digests' batch), without waiting on the
    device for them: on CUDA the GPU time between events recorded around each (read once the step's work is
    done), else host time."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host = 0.0
        self.spans: list = []

    @contextmanager
    def span(self):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self.spans.append((a, b))
        else:
            t0 = time.perf_counter()
            yield
            self.host += time.perf_counter() - t0

    def seconds(self) -> float:
        return self.host + sum(a.elapsed_time(b) for a, b in self.spans) * 1e-3  # elapsed_time is in ms


def _partials(params32: dict[str, torch.Tensor], tokens: torch.Tensor, lo: int, plan, ctx: StepContext,
              losses: list, partial_digests: list | None, load: dict, clock: _HashClock):
    """Generator of (coord, grads) in mesh order; records per-microbatch (windows, loss, ce, z), the partial
    gradients' digests (queued on the device: PendingNamed) and the expert loads."""
    names = list(params32)
    leaves = [params32[k] for k in names]
    for coord, wins in plan:
        rows = torch.tensor([w - lo for w in wins], dtype=torch.int64, device=tokens.device)
        out = forward(params32, ctx.cfg.model, tokens.index_select(0, rows), ctx.rope, z_loss=ctx.cfg.train.z_loss,
                      ops=ctx.ops)
        grads = torch.autograd.grad(out.loss, leaves, allow_unused=True)
        g = {k: (gi if gi is not None else torch.zeros_like(p)) for k, gi, p in zip(names, grads, leaves)}
        losses.append((wins, torch.stack([out.loss.detach(), out.ce.detach(), out.z.detach()])))
        for layer, counts in out.load.items():
            load[layer] = load[layer] + counts if layer in load else counts
        if partial_digests is not None:
            with clock.span():
                partial_digests.append((wins, PendingNamed(g)))
        yield coord, g


def _stage_digests(per_mb: torch.Tensor, partial_digests: list, reduced: dict, clipped: dict, state: TrainState,
                   memo: DigestMemo, clock: _HashClock) -> tuple[dict[str, str], float]:
    """The stage digests (module doc), and the perf_counter() their host time counts from. Every stage's tensors
    are hashed in one queued batch (its GPU time on the clock, from events) and read after one wait for the
    step's work: not one wait per stage, with the GPU idle while the host prepares the next."""
    stages = {"reduced": reduced, "clipped": clipped,  # an unclipped step's `clipped` holds `reduced`'s tensors
              "optimizer": {**{f"param/{k}": v for k, v in state.params.items()},
                            **{f"m/{k}": v for k, v in state.m.items()}, **{f"v/{k}": v for k, v in state.v.items()}}}
    with clock.span():
        memo.queue([x for named in stages.values() for x in named.values()])
    backward = blake3.blake3("".join(f"{w}:{d};" for w, d in sorted(_read(partial_digests))).encode()).hexdigest()
    t0 = time.perf_counter()  # the wait above was for the step's work and the queued hashes, timed by the clock
    return {"forward": tensor_digest(per_mb), "backward": backward,
            **{k: named_digest(named, memo) for k, named in stages.items()}}, t0


def _read(partial_digests: list | None) -> list | None:
    """(windows, hex) for (windows, PendingNamed or hex): waits for the queued hashes."""
    if partial_digests is None:
        return None
    return [(w, d if isinstance(d, str) else d.hex()) for w, d in partial_digests]


def run_step(state: TrainState, tokens: torch.Tensor, topology: Topology, ctx: StepContext,
             group=None) -> StepResult:
    """Run step `state.step` on its windows `tokens` [windows, seq_len + 1] (int64, in window order); in place.

    `group` (optional): a real data-parallel group with .rank, .world, .all_reduce_sum_(tensor),
    .all_reduce_max_(tensor), .all_gather(obj) -> list and, for dp_shard > 1, .mesh(dp_shard) -> (replica group,
    shard group) of collectives.CollectiveGroup; this process then runs only its rank's microbatches (module doc)."""
    t = ctx.cfg.train
    step = state.step
    lo, hi = ctx.batch.window_range(step)
    if tokens.shape != (hi - lo, ctx.cfg.model.seq_len + 1):
        raise ConfigError(f"step {step}: tokens must be [{hi - lo}, {ctx.cfg.model.seq_len + 1}], got {tuple(tokens.shape)}")
    if t.heldout_windows and hi > t.heldout_window:
        raise ConfigError(f"step {step} would train on windows [{lo}, {hi}) past train.heldout_window="
                          f"{t.heldout_window}: the held-out slice; raise heldout_window or stop earlier")
    plan = microbatch_plan(step, topology, t.micro_batch, ctx.batch)
    coords, weight = [c for c, _ in plan], weights(plan)
    n = sum(weight)  # the partials the mean is over: the step's microbatches, or its windows (weights' doc)
    sharded = None
    if group is not None:
        if topology.world != group.world:
            raise ConfigError(f"real data parallelism: topology {topology.label()} has {topology.world} ranks, the "
                              f"group {group.world}")
        if t.reduction == "ordered":
            if topology.dp_shard > 1:
                raise ConfigError(f"train.reduction='ordered' with HSDP ({topology.label()}) on real workers: not "
                                  f"wired; use 'exact' (the same bits on any mesh) or --dp-shard 1")
            if set(weight) != {1}:
                raise ConfigError("train.reduction='ordered': microbatches of different sizes (use 'exact')")
            accum = uniform_accum(coords, topology)  # every rank the same count, before the plan is cut to mine
        me = divmod(group.rank, topology.dp_shard)  # (replica, shard)
        plan = [(c, w) for c, w in plan if (c.replica, c.shard) == me]  # possibly none: it adds zeros
        if topology.dp_shard > 1:
            sharded = ShardedStep(state, topology.dp_shard, group)
    if state.shard is not None and sharded is None:
        raise ConfigError(f"step {step}: this rank holds only a slice of the optimizer state (HSDP); topology "
                          f"{topology.label()} needs the full state: restart from a checkpoint")
    params32 = {k: v.to(F32).requires_grad_(True) for k, v in state.params.items()}  # widened once per step
    losses: list = []
    load: dict[str, torch.Tensor] = {}
    partial_digests = [] if t.stage_digests else None
    clock = _HashClock(tokens.device)
    parts = _partials(params32, tokens, lo, plan, ctx, losses, partial_digests, load, clock)
    if group is None:
        reduced = reduce_gradients(parts, topology, coords, t.reduction, ctx.ops, weight)
    else:
        if t.reduction == "ordered":
            reduced = ordered_across_ranks(parts, accum, topology.dp_replicate, group.all_reduce_ordered_)
        elif sharded is not None:
            sums = exact_sums(parts, ctx.ops, like=params32, weight=dict(zip(coords, weight)))
            reduced = sharded.reduce(sums, n)  # my slice of it
        else:
            sums = exact_sums(parts, ctx.ops, like=params32, weight=dict(zip(coords, weight)))
            reduced = exact_across_ranks(sums, n, group)
        # every rank sees every microbatch's rows, digests and loads (in window order after the sort below)
        mine = ([(w, x.tolist()) for w, x in losses], _read(partial_digests),
                {k: v.tolist() for k, v in load.items()})
        losses, partial_digests, load = [], [] if partial_digests is not None else None, {}
        for rl, rd, rload in group.all_gather(mine):
            losses += [(w, torch.tensor(x, dtype=F32)) for w, x in rl]
            if partial_digests is not None:
                partial_digests += rd
            for layer, counts in rload.items():
                c = torch.tensor(counts, dtype=torch.int64)
                load[layer] = load[layer] + c if layer in load else c
    # microbatches keyed by their windows: the stage digests name the same work under any mesh order
    losses.sort(key=lambda wl: wl[0])
    per_mb = torch.stack([x for _, x in losses])  # [microbatches, (loss, ce, z)] in window order
    means = exact_mean(per_mb, dim=0)
    if sharded is None:
        norm, coef, clipped = clip(reduced, t.clip_norm, ctx.ops)
    else:
        norm, coef, clipped = sharded.clip(reduced, t.clip_norm)
    lr = ctx.lr.at_step(step, ctx.batch)
    applied, triggered = spike_decision(float(norm), state.spike, t)
    if applied:
        state.adam_step += 1
        if sharded is None:
            adamw_update(state.params, clipped, state.m, state.v, ctx.specs, state.adam_step, lr, t, ctx.ops)
        else:
            sharded.update(state.params, clipped, ctx.specs, state.adam_step, lr, t)
    if sharded is None:
        state.grads = clipped
    else:  # the writer gathers the full m, v and grads (and the mean for its digest); the others keep slices
        reduced = sharded.settle(state, reduced, clipped, t.stage_digests)
        clipped = state.grads
    state.step += 1
    state.tokens += (hi - lo) * ctx.cfg.model.seq_len
    memo = DigestMemo()
    digests, t0 = {}, time.perf_counter()
    if t.stage_digests and (sharded is None or sharded.writer):
        digests, t0 = _stage_digests(per_mb, partial_digests, reduced, clipped, state, memo, clock)
    return StepResult(step, (lo, hi), topology.label(), len(coords), float(means[0]), float(means[1]), float(means[2]),
                      float(norm), float(coef), lr, applied, triggered, digests,
                      time.perf_counter() - t0 + clock.seconds(),
                      {k: [int(c) for c in v.tolist()] for k, v in load.items()}, memo)
