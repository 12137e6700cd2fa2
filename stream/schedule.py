"""Schedules as pure functions of the optimizer step: the batch ramp, window ownership, the learning rate.

Batch ramp (report table 4): phases end at token boundaries; a step belongs to the first phase whose
`until_tokens` exceeds the tokens consumed before it, and takes that phase's windows per step
(micro-batch x nominal data-parallel degree x gradient-accumulation depth). Step s reads the contiguous
windows [start, end); a token here is a training position (seq_len per window, as the report counts).
Past the last boundary the last phase continues. The learning rate is anchored to tokens: linear
warmup, then one cosine to `final_fraction` of peak at the budget, evaluated at the tokens consumed
through the step, with IEEE + - * / only (`cos` below), so every platform computes the same float.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from fractions import Fraction

from stream.errors import ConfigError


def _pos_int(v: object, field: str, lo: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{field}: expected an int >= {lo}, got {v!r}")
    return v


@dataclass(frozen=True)
class BatchPhase:
    """Windows per step until `until_tokens` tokens have been consumed."""

    until_tokens: int
    windows_per_step: int

    def __post_init__(self) -> None:
        _pos_int(self.until_tokens, "phase.until_tokens")
        _pos_int(self.windows_per_step, "phase.windows_per_step")

    @classmethod
    def of(cls, until_tokens: int, micro_batch: int, dp_degree: int, grad_accum: int) -> "BatchPhase":
        """The report's form: micro-batch x nominal data-parallel degree x gradient-accumulation depth."""
        for v, f in ((micro_batch, "micro_batch"), (dp_degree, "dp_degree"), (grad_accum, "grad_accum")):
            _pos_int(v, f"phase.{f}")
        return cls(until_tokens, micro_batch * dp_degree * grad_accum)


@dataclass(frozen=True)
class BatchSchedule:
    """Step -> contiguous window range, from phases with increasing token boundaries."""

    seq_len: int
    phases: tuple[BatchPhase, ...]

    def __post_init__(self) -> None:
        _pos_int(self.seq_len, "seq_len")
        if not isinstance(self.phases, tuple) or not self.phases or not all(isinstance(p, BatchPhase) for p in self.phases):
            raise ConfigError("phases: expected a non-empty tuple of BatchPhase")
        if any(b.until_tokens <= a.until_tokens for a, b in zip(self.phases, self.phases[1:])):
            raise ConfigError("phases: until_tokens must increase strictly")
        # first step, first window of each phase: integer closed form, so step -> windows is O(phases)
        starts, step, win = [], 0, 0
        for p in self.phases:
            starts.append((step, win))
            per = p.windows_per_step * self.seq_len
            n = max(0, -(-(p.until_tokens - win * self.seq_len) // per))
            step, win = step + n, win + n * p.windows_per_step
        object.__setattr__(self, "_starts", tuple(starts))

    def _phase(self, step: int) -> int:
        _pos_int(step, "step", 0)
        i = 0
        while i + 1 < len(self.phases) and self._starts[i + 1][0] <= step:
            i += 1
        return i

    def window_range(self, step: int) -> tuple[int, int]:
        """[start, end) of the windows step `step` consumes."""
        i = self._phase(step)
        s0, w0 = self._starts[i]
        w = self.phases[i].windows_per_step
        start = w0 + (step - s0) * w
        return start, start + w

    def tokens_before(self, step: int) -> int:
        """Tokens consumed by steps 0 .. step-1."""
        return self.window_range(step)[0] * self.seq_len

    def tokens_through(self, step: int) -> int:
        """Tokens consumed by steps 0 .. step."""
        return self.window_range(step)[1] * self.seq_len

    def steps_for(self, tokens: int) -> int:
        """The number of steps after which at least `tokens` tokens are consumed."""
        _pos_int(tokens, "tokens", 0)
        i = len(self.phases) - 1
        while i > 0 and self._starts[i][1] * self.seq_len >= tokens:
            i -= 1
        s0, w0 = self._starts[i]
        per = self.phases[i].windows_per_step * self.seq_len
        return s0 + max(0, -(-(tokens - w0 * self.seq_len) // per))

    def windows_for(self, step: int, rank: int, world: int) -> range:
        """Windows of step `step` owned by data-parallel rank `rank` of `world`: those m with m mod world == rank."""
        return windows_for(step, rank, world, self)


def windows_for(step: int, rank: int, world: int, schedule: BatchSchedule) -> range:
    """Window m of a step belongs to rank m mod world; the same windows in the same order for any world."""
    _pos_int(world, "world")
    _pos_int(rank, "rank", 0)
    if rank >= world:
        raise ConfigError(f"rank: expected an int in [0, {world}), got {rank}")
    start, end = schedule.window_range(step)
    return range(start + (rank - start) % world, end, world)


# -- cos from + - * / only ---------------------------------------------------------------------------
def _f64(hex_bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(hex_bits))[0]


PI = 3.141592653589793  # a literal: parsing is correctly rounded everywhere, unlike a libm call
_INV_PIO2 = _f64("3FE45F306DC9C883")  # 2/pi
# pi/2 split as in fdlibm's __ieee754_rem_pio2: the head has 33 bits, so k * head is exact for |k| < 2**20
_PIO2_HI = _f64("3FF921FB54400000")
_PIO2_LO = _f64("3DD0B4611A626331")
_LIMIT = 1.5e6  # |x| < 2**20 * pi/2 keeps k * _PIO2_HI exact
# Taylor coefficients (-1)^i / (2i)! and (-1)^i / (2i+1)!: int / int is correctly rounded in Python
_COS = [float(Fraction((-1) ** i, _f)) for i, _f in enumerate(
    [1, 2, 24, 720, 40320, 3628800, 479001600, 87178291200, 20922789888000])]
_SIN = [float(Fraction((-1) ** i, _f)) for i, _f in enumerate(
    [1, 6, 120, 5040, 362880, 39916800, 6227020800, 1307674368000, 355687428096000])]


def _poly(c: list[float], z: float) -> float:
    acc = 0.0
    for a in reversed(c):  # Horner, one rounding per + and *: no FMA in CPython
        acc = acc * z + a
    return acc


def cos(x: float) -> float:
    """cos(x) for |x| < 1.5e6 with IEEE + - * / only (error vs math.cos < 1e-15, tested).

    Range reduction r = x - k*pi/2 (Cody-Waite, two-part pi/2), then Taylor polynomials on |r| <= pi/4,
    truncated where the next term is below 2e-18.
    """
    x = float(x)
    if not -_LIMIT < x < _LIMIT:
        raise ValueError(f"cos: |x| must be < {_LIMIT}, got {x!r}")
    k = round(x * _INV_PIO2)  # round() of a float is exact
    r = (x - k * _PIO2_HI) - k * _PIO2_LO
    z = r * r
    q = k % 4
    if q == 0:
        return _poly(_COS, z)
    if q == 1:
        return -(r * _poly(_SIN, z))
    if q == 2:
        return -_poly(_COS, z)
    return r * _poly(_SIN, z)


@dataclass(frozen=True)
class LRSchedule:
    """Learning rate by consumed tokens: linear warmup to `peak`, one cosine to `final_fraction * peak` at `budget_tokens`."""

    peak: float
    warmup_tokens: int
    budget_tokens: int
    final_fraction: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.peak, bool) or not isinstance(self.peak, (int, float)) or not 0 < self.peak < float("inf"):
            raise ConfigError(f"lr.peak: expected a finite float > 0, got {self.peak!r}")
        _pos_int(self.warmup_tokens, "lr.warmup_tokens", 0)
        _pos_int(self.budget_tokens, "lr.budget_tokens")
        if self.budget_tokens <= self.warmup_tokens:
            raise ConfigError(f"lr.budget_tokens: must exceed warmup_tokens ({self.warmup_tokens}), got {self.budget_tokens}")
        f = self.final_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1:
            raise ConfigError(f"lr.final_fraction: expected a float in [0, 1], got {f!r}")

    def at_tokens(self, tokens: int) -> float:
        """The learning rate once `tokens` tokens are consumed."""
        _pos_int(tokens, "tokens", 0)
        peak = float(self.peak)
        if tokens < self.warmup_tokens:
            return peak * (tokens / self.warmup_tokens)  # int / int: one correctly rounded division
        floor = peak * float(self.final_fraction)
        if tokens >= self.budget_tokens:
            return floor
        progress = (tokens - self.warmup_tokens) / (self.budget_tokens - self.warmup_tokens)
        return floor + (peak - floor) * (0.5 * (1.0 + cos(PI * progress)))

    def at_step(self, step: int, batch: BatchSchedule) -> float:
        """The learning rate of step `step`: at the tokens consumed through it (step 0 is not lr 0)."""
        return self.at_tokens(batch.tokens_through(step))


# Named presets are data. OPEN-1B, report tables 3 and 4: 48 GPUs x micro-batch 4, accumulation 4/6/12.
OPEN_1B_BATCH = BatchSchedule(4096, (BatchPhase.of(4_000_000_000, 4, 48, 4),
                                     BatchPhase.of(360_000_000_000, 4, 48, 6),
                                     BatchPhase.of(400_000_000_000, 4, 48, 12)))
# warmup: 667 steps of the warmup-phase batch (~2.1B tokens); cosine to 10% of 4.5e-4 at 400B tokens
OPEN_1B_LR = LRSchedule(4.5e-4, 667 * 768 * 4096, 400_000_000_000, 0.1)
# the embedded demo: short windows and a two-phase ramp, enough to exercise every branch quickly
DEMO_BATCH = BatchSchedule(256, (BatchPhase(65_536, 8), BatchPhase(10 ** 15, 16)))
DEMO_LR = LRSchedule(3e-3, 65_536, 50_000_000, 0.1)
BATCH_PRESETS = {"open-1b": OPEN_1B_BATCH, "demo": DEMO_BATCH}
LR_PRESETS = {"open-1b": OPEN_1B_LR, "demo": DEMO_LR}
