"""The canonical gradient reduction of one step: microbatches -> ranks -> shards -> replicas.

One function, `reduce_gradients`, that collectives/ will own; partials arrive in mesh order (replica-major,
shard-minor, then the rank's microbatches in order). Two definitions, picked by `train.reduction`:

"ordered" (the report's Algorithm 1 and appendix A): per rank, float32 adds of its microbatch gradients in
    order, times 1/accum; shards added in ascending order into `inner`, times 1/dp_shard; replicas folded
    by collectives.TreeFold (the pairing of a recursive-doubling all-reduce), times 1/dp_replicate.
    Bits depend on the topology; a replay reproduces them by running the same virtual topology.

"exact" (beyond the paper): every partial is rounded once, element by element, to a fixed absolute grid
    of 2^-96 and added as integers in three int64 limbs of 40-bit digits (`ExactSum`). Integer addition is
    associative, so the sum is the same for every grouping: per rank, across shards, across replicas, in
    any order, atomics included. The unique carry-normalized digits go through a fixed chain of float64
    operations (times 1/n) and one float32 rounding (the format and the chain: collectives/limbs.py).
    Between real ranks the integers travel on the compact wire (`exact_across_ranks`,
    collectives/exact_wire.py): about 8 bytes an element instead of the limbs' 32, the same bits.
    With a topology-independent microbatch partition (micro_batch = 1: a microbatch is one window), a
    step's bits are then independent of the world size itself. Range: |g| < 2^24 per element and up to
    2^22 partials; larger or non-finite elements propagate as inf/NaN (order-free), and values below
    2^-97 round to the grid (far below AdamW's eps, so they cannot move an update).
Averages are multiplications by reciprocals (appendix A.3), never divisions.
Given `ops` = kernels.backend("triton"), ExactSum runs fused Triton kernels on CUDA tensors
(kernels/triton/exactsum.py: the same bits, without the chains of eager float64 ops); ops=None is eager.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from training.config import REDUCTIONS, Topology
from training.errors import ConfigError
from collectives.exact_wire import compact_exact_sum
from collectives.limbs import DIGIT, GRID, LIMIT, MAX_PARTIALS, scaled, to_float32, value
from collectives.treefold import TreeFold
from kernels import is_triton
from kernels.ref.chunks import spans
from kernels.ref.fixed import pow2

F32, F64 = torch.float32, torch.float64


@dataclass(frozen=True)
class Coord:
    """Where a partial ran: replica, shard, and its window's place among that rank's windows."""

    replica: int
    shard: int
    micro: int


def _p2(e: int, device) -> torch.Tensor:
    return pow2(torch.tensor(e, device=device))


def _fused_kernels(ops):
    """kernels.triton.exactsum when `ops` is the Triton backend (kernels.backend("triton")), else None."""
    if not is_triton(ops):
        return None
    from kernels.triton import exactsum  # lazy: triton is optional (the `gpu` extra)

    return exactsum


FUSED = 4  # partials kept pending, then added in one pass (kernels/triton/exactsum.py MAX_FUSED)


class ExactSum:
    """Order-free exact sum of float32 tensors of one shape (see module doc): add in any order, same bits.

    Partials wait in `pending` until FUSED of them have come (or the sum is read): the fused kernels add them in
    one pass over the limbs, not one pass each (integer adds: the same bits). A sum of one partial is the
    grid-rounded partial itself (the limbs would reconstruct exactly that integer), so accum = world = 1 costs
    no limbs.
    """

    def __init__(self, shape: tuple[int, ...], device, ops=None) -> None:
        self.shape, self.device = tuple(shape), device
        self._fused = _fused_kernels(ops)
        self.limbs: torch.Tensor | None = None  # allocated when a second partial arrives
        self._bad: torch.Tensor | None = None  # allocated when first needed (None: all +0.0)
        self.pending: list[torch.Tensor] = []  # partials not yet in the limbs (kept by reference)
        self.count = 0

    @property
    def bad(self) -> torch.Tensor:
        """The order-free float64 sum of inf/NaN stand-ins. Zeros until something needs it: a single partial's
        fused result never does, and at the model's size the zeros are 8 bytes a parameter to fill and read."""
        if self._bad is None:
            self._bad = torch.zeros(self.shape, dtype=F64, device=self.device)
        return self._bad

    @bad.setter
    def bad(self, value: torch.Tensor) -> None:
        self._bad = value

    # the eager path's exact powers of two, made on first use (the fused path needs none: no small copies to the GPU)
    _up = functools.cached_property(lambda self: _p2(GRID, self.device))
    _d80 = functools.cached_property(lambda self: _p2(-2 * DIGIT, self.device))
    _d40 = functools.cached_property(lambda self: _p2(-DIGIT, self.device))
    _m80 = functools.cached_property(lambda self: _p2(2 * DIGIT, self.device))
    _m40 = functools.cached_property(lambda self: _p2(DIGIT, self.device))

    def _kernels(self, *tensors: torch.Tensor):
        """The fused kernels when they take these tensors (Triton backend, CUDA, contiguous limbs), else None."""
        k = self._fused
        bad = () if self._bad is None else (self._bad,)
        if k is None or not k.on_triton(*tensors, *bad) or not all(b.is_contiguous() for b in bad):
            return None
        return k if self.limbs is None or (self.limbs.is_contiguous() and k.on_triton(self.limbs)) else None

    def _grid(self, g: torch.Tensor) -> torch.Tensor:
        """round(g * 2^GRID) in float64 (half to even, the one rounding); out-of-range elements go to `bad`."""
        r, bad = self._grid_part(g)
        if bad is not None:
            self.bad = self.bad + bad
        return r

    def _grid_part(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(round(g * 2^GRID) in float64, the inf/NaN stand-ins of g's out-of-range elements or None if none)."""
        x = g.to(F64)
        if x.numel() and not bool(torch.amax(x.abs()) < LIMIT):  # NaN fails the test too
            ok = torch.isfinite(x) & (x.abs() < LIMIT)
            # out-of-range elements become inf with their sign (NaN stays NaN): sums of those are order-free
            return torch.round(torch.where(ok, x, torch.zeros_like(x)) * self._up), \
                torch.where(ok, torch.zeros_like(x), x * float("inf"))
        return torch.round(x * self._up), None  # exact scaling; r has <= 25 significant bits, |r| < 2^120

    def _accumulate(self, g: torch.Tensor) -> None:
        """Add one partial to the limbs, eagerly (the fused path takes several at once: `_flush`)."""
        if self.limbs is None:
            self.limbs = torch.zeros((3, *self.shape), dtype=torch.int64, device=self.device)
        if not self.limbs.is_contiguous():
            self._add_digits(self.limbs, self._grid(g))
            return
        # a chunk at a time on a CPU (kernels/ref/chunks.py: elementwise, the same bits)
        flat, limbs, bad = g.reshape(-1), self.limbs.view(3, -1), []
        for a, b in spans(flat.numel(), g.device):
            r, stand_in = self._grid_part(flat[a:b])
            self._add_digits(limbs[:, a:b], r)
            if stand_in is not None:
                bad.append((a, b, stand_in))
        if bad:
            stand_ins = torch.zeros(flat.numel(), dtype=F64, device=self.device)
            for a, b, stand_in in bad:
                stand_ins[a:b] = stand_in
            self.bad = self.bad + stand_ins.view(self.shape)

    def _add_digits(self, limbs: torch.Tensor, r: torch.Tensor) -> None:
        """limbs [3, ...] += the 40-bit digits of the grid integers r (float64, exact)."""
        d2 = torch.trunc(r * self._d80)  # digits by truncation keep r's sign, and every op is exact:
        r = r - d2 * self._m80           # each remainder is the low bits of a short integer
        d1 = torch.trunc(r * self._d40)
        d0 = r - d1 * self._m40
        limbs[0] += d0.to(torch.int64)
        limbs[1] += d1.to(torch.int64)
        limbs[2] += d2.to(torch.int64)

    def _flush(self) -> None:
        """Every pending partial into the limbs."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        k = self._kernels(*pending)
        if k is None:
            for g in pending:
                self._accumulate(g)
            return
        fresh = self.limbs is None
        if fresh:
            self.limbs = torch.empty((3, *self.shape), dtype=torch.int64, device=self.device)
        for i in range(0, len(pending), k.MAX_FUSED):  # _grid and the digits in one pass (bad updated in place)
            k.accumulate(pending[i:i + k.MAX_FUSED], self.limbs, self.bad, fresh and i == 0)

    def add(self, g: torch.Tensor) -> None:
        """Add a partial (kept by reference until it is accumulated: do not modify it)."""
        if self.count >= MAX_PARTIALS:
            raise ConfigError(f"reduction: more than {MAX_PARTIALS} partials for one exact sum")
        self.pending.append(g)
        self.count += 1
        if len(self.pending) == FUSED:
            self._flush()

    def merge(self, other: "ExactSum") -> None:
        """Add another accumulator's integers (what an int64 all-reduce of the limbs does)."""
        self._flush()
        other._flush()
        if other.limbs is not None:
            if self.limbs is None:
                self.limbs = torch.zeros_like(other.limbs)
            self.limbs += other.limbs
        self.bad = self.bad + other.bad
        self.count += other.count

    def shared(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(limbs, bad) for a cross-rank int64/float64 all-reduce SUM (integer addition: any order, same bits).

        Materializes the limbs (a pending single partial is accumulated); after the in-place all-reduce the
        accumulator holds the sum over every rank and `result` gives the same bits as one process would."""
        self._flush()
        if self.limbs is None:
            self.limbs = torch.zeros((3, *self.shape), dtype=torch.int64, device=self.device)
        return self.limbs, self.bad

    def wire(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(limbs (3, numel), bad (numel,) or None where all +0.0) for the compact wire (collectives/exact_wire.py),
        which carry-normalizes the limbs in place (the same integers). Materializes the limbs as `shared` does."""
        self._flush()
        if self.limbs is None:
            self.limbs = torch.zeros((3, *self.shape), dtype=torch.int64, device=self.device)
        n = self.limbs[0].numel()
        return self.limbs.view(3, n), None if self._bad is None else self._bad.view(n)

    @classmethod
    def of_shared(cls, limbs: torch.Tensor, bad: torch.Tensor, ops=None) -> "ExactSum":
        """An accumulator holding summed (limbs, bad) buffers, e.g. a slice of `shared()`'s (result is elementwise)."""
        s = cls(tuple(bad.shape), bad.device, ops)
        s.limbs, s.bad = limbs, bad
        return s

    def result(self, scale: float = 1.0) -> torch.Tensor:
        """The sum times the host double `scale` (e.g. 1/n), rounded once to float32."""
        if len(self.pending) > 1 or (self.pending and self.limbs is not None):
            self._flush()
        single = self.pending[0] if self.pending else None  # the one partial of the sum
        src = single if single is not None else self.limbs
        k = self._kernels(src) if src is not None else None
        if k is not None:
            return k.result(src, self._bad, scale, single is not None, self.shape)
        if single is not None:
            # one partial: the integer the limbs would reconstruct exactly (+ 0.0: an integer zero has no sign)
            v = self._grid(single) + 0.0
        elif self.limbs is None:
            v = torch.zeros(self.shape, dtype=F64, device=self.device)
        else:  # the unique carry-normalized digits through the format's fixed float64 chain (collectives/limbs.py)
            v = value(self.limbs)
        return to_float32(scaled(v, scale), self._bad)


def _scale(g: dict[str, torch.Tensor], n: int) -> dict[str, torch.Tensor]:
    if n == 1:
        return g
    inv = torch.tensor(1.0 / n, dtype=F32)  # reciprocal multiply: CUDA's scalar division differs from the CPU's
    return {k: v * inv.to(v.device) for k, v in g.items()}


def window_coords(plan: list[tuple[Coord, list[int]]]) -> list[Coord]:
    """Every window's coord, in plan order, from a plan of (microbatch coord, its windows): the partials a step
    reduces, one per window; a microbatch's `micro` is its first window's place among its rank's windows."""
    return [Coord(c.replica, c.shard, c.micro + j) for c, wins in plan for j in range(len(wins))]


def mesh_order(topo: Topology, accum: int) -> list[Coord]:
    """Every microbatch of a step in mesh order: replica-major, shard-minor, then accumulation."""
    return [Coord(r, s, a) for r in range(topo.dp_replicate) for s in range(topo.dp_shard) for a in range(accum)]


def _checked(partials: Iterable[tuple[Coord, dict[str, torch.Tensor]]],
             want: list[Coord]) -> Iterator[tuple[Coord, dict[str, torch.Tensor]]]:
    i = 0
    for c, g in partials:
        if i >= len(want) or c != want[i]:
            raise ConfigError(f"reduction: partial {i} is {c}, expected {want[i] if i < len(want) else 'none'} "
                              f"(the step's microbatches in mesh order)")
        i += 1
        yield c, g
    if i != len(want):
        raise ConfigError(f"reduction: got {i} partials, the step has {len(want)} microbatches")


def exact_sums(partials: Iterable[tuple[Coord, dict[str, torch.Tensor]]], ops=None,
               like: dict[str, torch.Tensor] | None = None) -> dict[str, ExactSum]:
    """Per tensor name, the ExactSum of the partials (any order, any subset: e.g. one real rank's windows).

    `ops`: the op backend (ExactSum's fused kernels under kernels.backend("triton")); None is eager. `like`: a
    tensor per name, so that a rank with no partial still holds a (zero) sum of every tensor to all-reduce."""
    sums: dict[str, ExactSum] = {k: ExactSum(tuple(v.shape), v.device, ops) for k, v in (like or {}).items()}
    for _, g in partials:
        for k, v in g.items():
            if k not in sums:
                sums[k] = ExactSum(tuple(v.shape), v.device, ops)
            sums[k].add(v)
    return sums


def exact_result(sums: dict[str, ExactSum], n: int) -> dict[str, torch.Tensor]:
    """The mean over `n` partials from the (possibly all-reduced) exact sums."""
    return {k: s.result(1.0 / n) for k, s in sums.items()}


def exact_across_ranks(sums: dict[str, ExactSum], n: int, group) -> dict[str, torch.Tensor]:
    """The mean over `n` partials of every rank's sums, `exact_result`'s bits: one compact exact all-reduce
    (collectives/exact_wire.py, ~8 bytes an element) over every tensor in name order, the same on every rank."""
    names = sorted(sums)
    outs, _ = compact_exact_sum([sums[k].wire() for k in names], group, 1.0 / n)
    return {k: out.view(sums[k].shape) for k, out in zip(names, outs)}


def uniform_accum(coords: list[Coord], topology: Topology) -> int:
    """The microbatches per rank when every rank has the same number (what `ordered` needs); else ConfigError."""
    per_rank: dict[tuple[int, int], int] = {}
    for c in coords:
        per_rank[(c.replica, c.shard)] = per_rank.get((c.replica, c.shard), 0) + 1
    counts = {per_rank.get((r, s), 0) for r in range(topology.dp_replicate) for s in range(topology.dp_shard)}
    if len(counts) != 1 or 0 in counts:
        raise ConfigError(f"train.reduction='ordered' on {topology.label()}: its ranks run {sorted(counts)} "
                          f"microbatches; the ordered fold needs the same number on every rank (use 'exact', which "
                          f"takes any split)")
    return counts.pop()


def ordered_across_ranks(partials: Iterable[tuple[Coord, dict[str, torch.Tensor]]], accum: int, replicas: int,
                         all_reduce_) -> dict[str, torch.Tensor]:
    """The ordered definition on real ranks (one rank per replica): this rank's float32 adds of its `accum`
    microbatch gradients in order, times 1/accum, then `all_reduce_` of them (collectives' recursive doubling,
    whose bits are TreeFold's: those of the virtual topology's fold), times 1/replicas. Every tensor goes in one
    flat buffer, in name order (elementwise adds: the same bits as one all-reduce per tensor)."""
    rank, i = None, 0
    for _, g in partials:
        g = {k: v.to(F32) for k, v in g.items()}
        rank = g if rank is None else {k: rank[k] + g[k] for k in rank}
        i += 1
    if i != accum or rank is None:
        raise ConfigError(f"train.reduction='ordered': this rank ran {i} microbatches, every rank must run {accum}")
    rank = _scale(rank, accum)
    names = sorted(rank)
    flat = torch.cat([rank[k].reshape(-1) for k in names])
    all_reduce_(flat)
    out, at = {}, 0
    for k in names:
        out[k] = flat[at:at + rank[k].numel()].view(rank[k].shape)
        at += rank[k].numel()
    return _scale(out, replicas)


def reduce_gradients(partials: Iterable[tuple[Coord, dict[str, torch.Tensor]]], topology: Topology,
                     coords: list[Coord], mode: str = "exact", ops=None) -> dict[str, torch.Tensor]:
    """The mean gradient over a step's windows, reduced by `mode` (module doc); float32 tensors. `coords`: the
    step's partials (one per window) in mesh order.

    `partials` may be a generator: at most one partial (plus the accumulators) is resident at a time.
    """
    if mode not in REDUCTIONS:
        raise ConfigError(f"train.reduction: expected one of {REDUCTIONS}, got {mode!r}")
    it = _checked(partials, coords)
    if mode == "exact":
        return exact_result(exact_sums(it, ops), len(coords))
    accum = uniform_accum(coords, topology)
    fold = TreeFold()
    inner = rank = None
    for c, g in it:
        g = {k: v.to(F32) for k, v in g.items()}
        rank = g if c.micro == 0 else {k: rank[k] + g[k] for k in rank}
        if c.micro == accum - 1:
            rank = _scale(rank, accum)
            inner = rank if c.shard == 0 else {k: inner[k] + rank[k] for k in inner}
            if c.shard == topology.dp_shard - 1:
                fold.push(_scale(inner, topology.dp_shard))
    return _scale(fold.result(), topology.dp_replicate)
