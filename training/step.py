"""The one training step, used by the trainer and (later) by the replay: a step on a virtual topology.

For each microbatch in mesh order (replica-major, shard-minor, then accumulation), forward and backward
with kernels ops on the float32 widening of the masters; each window's gradient, its own (training/windows.py),
streams into the canonical reduction (training/reduction.py) as one partial; then the pre-clip norm, the clip,
the spike protocol and AdamW. Rank r = replica * dp_shard + shard owns window m iff m mod world == r
(stream.windows_for); its windows are cut into microbatches of `micro_batch` consecutive owned windows, which
run together. A step's partials are its windows whatever the cut, so its bits depend neither on `micro_batch`
nor, with the exact reduction, on the topology. One process thus computes the bits a cluster of that shape
computes.

Stage digests (the hash log's `digests`, what a replay uses to say which stage diverged): `forward`, the
windows' float32 (loss, ce, z) rows sorted by window; `backward`, blake3 over
"windows:named_digest(partial gradients);" sorted by windows; `reduced` and `clipped`, named_digest of the
reduced and post-clip gradients; `optimizer`, named_digest of the updated parameters and both moments
(kernels/digest.py). Keyed by windows, not mesh position, they name the same work under any topology. The raw
tensor digests behind `clipped` and `optimizer` are the end state's: the result's `memo` hands them to the
state hash, so a step hashes each tensor's bytes once.

Real data parallelism (training/ray_train.py): `run_step(..., group=g)` with a real group of g.world ranks and a
topology R x S with R * S == g.world; this process (rank r = replica * S + shard) computes only the
microbatches of rank r into exact int64 accumulators, and the cross-rank reduction runs bucket by bucket as the
last of them's backward produces the gradients (training/overlap.py: leaf hooks, one communication thread; the same
bits). With S = 1 they are summed across ranks on the compact exact wire (collectives/exact_wire.py: integer
all-reduces, order-free, about 8 bytes an element), so every rank holds the bits the one-process virtual topology
computes, and every rank clips
and runs AdamW on the full tensors. With S > 1 (HSDP, training/sharding.py) they are reduce-scattered
to the shard owners of each replica and summed across replicas; each owner clips its slice with the global
norm (global_l2_norm's bits) and updates its slice of parameters and moments; the parameters are all-gathered
in the replica. Rank 0 then holds the full state (m, v and grads gathered to it); every other rank holds full
parameters and only its slice of m, v and grads (`state.shard`), and returns no stage digests. Either way the
per-window loss rows, partial digests and expert loads are gathered to every rank, so rank 0 logs the
digests of the one-process run on the same virtual topology. With `ordered` reduction (S = 1 only) each rank
folds its windows' gradients in order and the ranks' means meet in collectives' recursive-doubling all-reduce, whose
bits are TreeFold's: the bits of the virtual topology R x 1, 4 bytes an element on the wire.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import blake3
import torch

import stream
from training.config import RunConfig, Topology
from kernels.digest import DigestMemo, PendingNamed, named_digest, tensor_digest
from training.errors import ConfigError
from training.model import forward, rope_for
from training.optim import SpikeState, spike_decision
from training.overlap import BUCKET_ELEMENTS
from training.params import ParamSpec, spec_map
from training.reduction import Coord, window_coords
from training.sharding import Shard
from training.strategies import read_partial_digests, strategy_for
from training import windows
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
    accum: int  # the step's partial gradients over all ranks: one per window, on any world and any micro_batch
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
    bucket_elements: int = BUCKET_ELEMENTS  # real groups: the gradient buckets' size (training/overlap.py); no bit
    observer: Callable[[str, int], None] | None = None  # real groups: sees the reduction's timeline (overlap.EVENTS)

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
    where they do not divide. Ranks may own different numbers of windows, or none (then no microbatch). A coord's
    `micro` is its first window's place among the rank's windows: window j of a microbatch is `micro + j`."""
    plan = []
    for rank in range(topology.world):
        owned = list(stream.windows_for(step, rank, topology.world, batch))
        replica, shard = divmod(rank, topology.dp_shard)
        for i in range(0, len(owned), micro_batch):
            plan.append((Coord(replica, shard, i), owned[i:i + micro_batch]))
    return plan


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
              losses: list, partial_digests: list | None, load: dict, clock: _HashClock, watch=None):
    """Generator of (coord, grads), one per window in mesh order: each microbatch's windows run forward and
    backward together, each window's gradient its own (training/windows.py). Records per window (windows, loss,
    ce, z), the partial gradients' digests (queued on the device: PendingNamed), and the expert loads.
    `watch(leaves, coords)`, when given, sees each microbatch's per-window leaves before its backward."""
    names = list(params32)
    for micro, (coord, wins) in enumerate(plan):
        rows = torch.tensor([w - lo for w in wins], dtype=torch.int64, device=tokens.device)
        per = windows.leaves(params32, len(wins))
        coords = window_coords([(coord, wins)])
        if watch is not None:
            watch(per, coords)
        out = forward(per, ctx.cfg.model, tokens.index_select(0, rows), ctx.rope, z_loss=ctx.cfg.train.z_loss,
                      ops=ctx.ops)
        flat = [leaf for k in names for leaf in per[k]]
        # the windows' losses are separate: a sum's backward hands each window's loss the gradient 1 exactly
        total = out.loss.sum()  # br-ok: only its backward (a 1 for each window) is used, never its value
        grads = list(torch.autograd.grad(total, flat, allow_unused=True))
        if ctx.observer is not None:
            ctx.observer("backward_end", micro)  # this microbatch's backward has returned
        for layer, counts in out.load.items():
            load[layer] = load[layer] + counts if layer in load else counts
        n = len(wins)
        for j, (w, c) in enumerate(zip(wins, coords)):
            g = {k: (grads[i * n + j] if grads[i * n + j] is not None else torch.zeros_like(params32[k]))
                 for i, k in enumerate(names)}
            for i in range(len(names)):  # the partial is g's alone now: freed once the reduction has taken it
                grads[i * n + j] = None
            losses.append(([w], torch.stack([out.loss[j].detach(), out.ce[j].detach(), out.z[j].detach()])))
            if partial_digests is not None:
                with clock.span():
                    partial_digests.append(([w], PendingNamed(g)))
            yield c, g


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
    backward = blake3.blake3("".join(f"{w}:{d};" for w, d in sorted(read_partial_digests(partial_digests))).encode()).hexdigest()
    t0 = time.perf_counter()  # the wait above was for the step's work and the queued hashes, timed by the clock
    return {"forward": tensor_digest(per_mb), "backward": backward,
            **{k: named_digest(named, memo) for k, named in stages.items()}}, t0


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
    params32 = {k: v.to(F32) for k, v in state.params.items()}  # widened once per step
    strategy = strategy_for(ctx, state, topology, plan, group, params32)
    losses: list = []
    load: dict[str, torch.Tensor] = {}
    partial_digests = [] if t.stage_digests else None
    clock = _HashClock(tokens.device)
    reduced = strategy.reduce(_partials(params32, tokens, lo, strategy.plan, ctx, losses, partial_digests, load,
                                        clock, strategy.watch))
    losses, partial_digests, load = strategy.gather(losses, partial_digests, load)
    # keyed by window: the stage digests name the same work under any mesh order and any microbatch cut
    losses.sort(key=lambda wl: wl[0])
    per_mb = torch.stack([x for _, x in losses])  # [windows, (loss, ce, z)] in window order
    means = exact_mean(per_mb, dim=0)
    norm, coef, clipped = strategy.clip(reduced, t.clip_norm)
    lr = ctx.lr.at_step(step, ctx.batch)
    applied, triggered = spike_decision(float(norm), state.spike, t)
    if applied:
        state.adam_step += 1
        strategy.update(state, clipped, lr, t)
    reduced, clipped = strategy.settle(state, reduced, clipped)
    state.step += 1
    state.tokens += (hi - lo) * ctx.cfg.model.seq_len
    memo = DigestMemo()
    digests, t0 = {}, time.perf_counter()
    if t.stage_digests and strategy.writer:
        digests, t0 = _stage_digests(per_mb, partial_digests, reduced, clipped, state, memo, clock)
    return StepResult(step, (lo, hi), topology.label(), hi - lo, float(means[0]), float(means[1]), float(means[2]),
                      float(norm), float(coef), lr, applied, triggered, digests,
                      time.perf_counter() - t0 + clock.seconds(),
                      {k: [int(c) for c in v.tolist()] for k, v in load.items()}, memo)
