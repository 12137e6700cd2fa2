"""Sampled audits: a seeded draw of a run's segments, and what auditing only the drawn ones proves.

The draw (METHOD): each segment [a, b) of the population gets the key blake3("<run hash>/<seed>/<a>:<b>") read as a
big-endian integer, and the ceil(fraction * N) segments with the smallest keys are drawn. A plain string in, a hash
out: the same segments on any machine, Python version or language, and a larger fraction with the same seed draws a
superset. Keys of a cryptographic hash rank the segments as a uniform random permutation would, so the draw is
uniform without replacement. Not random.Random(seed).sample: Python promises the same random() sequence across
versions, not the same sample(), and an auditor elsewhere may redraw with another language.

What it proves: with n of N segments drawn, if k of the N had been tampered with, the draw misses all k with
probability C(N-k, n) / C(N, n) (hypergeometric), computed exactly here as a Fraction: at N = 10^5 it is far below
what a float can hold.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction

import blake3

from training.errors import ConfigError

METHOD = "blake3-rank/1"
THRESHOLDS = (5, 1)  # percent: a statement gives the fewest tampered segments missed with less than these

Segment = tuple[int, int]


@dataclass(frozen=True)
class Sample:
    """A job's sample: the population (contiguous segments of steps), the fraction and seed, the drawn segments."""
    population: tuple[Segment, ...]
    fraction: float
    seed: int
    drawn: tuple[Segment, ...]

    def __post_init__(self) -> None:
        check_fraction(self.fraction)
        check_seed(self.seed)
        pop = self.population
        if not pop or any(not 0 <= a < b for a, b in pop) or any(x[1] != y[0] for x, y in zip(pop, pop[1:])):
            raise ConfigError(f"sample population: expected contiguous segments [a, b) in step order, got {pop[:4]}...")
        if len(self.drawn) != sample_size(self.fraction, len(pop)) or not set(self.drawn) <= set(pop):
            raise ConfigError(f"sample: expected {sample_size(self.fraction, len(pop))} drawn segments of the "
                              f"population, got {list(self.drawn)[:4]}...")

    @property
    def steps(self) -> Segment:
        """The steps [first, end) the population covers."""
        return self.population[0][0], self.population[-1][1]

    def to_json(self) -> str:
        return json.dumps({"method": METHOD, "fraction": self.fraction, "seed": self.seed,
                           "population": [list(s) for s in self.population],
                           "drawn": [list(s) for s in self.drawn]}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Sample:
        """The sample `to_json` wrote; ValueError, KeyError or TypeError where `text` is not one of METHOD."""
        d = json.loads(text)
        if d.get("method") != METHOD:
            raise ConfigError(f"sample: expected method {METHOD!r}, got {d.get('method')!r}")
        pairs = lambda key: tuple((int(a), int(b)) for a, b in d[key])  # noqa: E731
        return cls(pairs("population"), float(d["fraction"]), int(d["seed"]), pairs("drawn"))


def check_fraction(fraction: float) -> float:
    """ConfigError naming --sample unless 0 < fraction <= 1."""
    if not 0 < fraction <= 1:  # NaN too
        raise ConfigError(f"--sample {fraction}: expected a fraction of the segments, 0 < FRACTION <= 1")
    return fraction


def check_seed(seed: int) -> int:
    """ConfigError naming --seed unless seed is an integer >= 0."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"--seed {seed}: expected an integer >= 0")
    return seed


def sample_size(fraction: float, population: int) -> int:
    """ceil(fraction * N), at least 1; the fraction as the decimal it is written as (0.1 * 30 is 3, not 4)."""
    return max(1, math.ceil(Fraction(repr(check_fraction(fraction))) * population))


def _key(run_hash: str, seed: int, segment: Segment) -> int:
    return int.from_bytes(blake3.blake3(f"{run_hash}/{seed}/{segment[0]}:{segment[1]}".encode()).digest(), "big")


def draw(population: list[Segment], fraction: float, seed: int, run_hash: str) -> Sample:
    """The sample of `population` that `fraction` and `seed` draw for the run `run_hash` (module doc: METHOD)."""
    pop = tuple(sorted((int(a), int(b)) for a, b in population))
    n = sample_size(fraction, len(pop))
    check_seed(seed)
    ranked = sorted(pop, key=lambda s: (_key(run_hash, seed, s), s))
    return Sample(pop, fraction, seed, tuple(sorted(ranked[:n])))


def reproduces(sample: Sample, run_hash: str) -> bool:
    """Whether the sample's drawn segments are what its population, fraction and seed draw (not hand-picked)."""
    return draw(list(sample.population), sample.fraction, sample.seed, run_hash).drawn == sample.drawn


# -- what a sample proves ------------------------------------------------------------------------------------
def miss_probability(population: int, audited: int, tampered: int) -> Fraction:
    """C(N-k, n) / C(N, n): the chance that n of N segments drawn uniformly miss all k tampered ones; exact."""
    if not 0 <= audited <= population or not 0 <= tampered <= population:
        raise ValueError(f"miss_probability: need 0 <= n, k <= N; got N={population}, n={audited}, k={tampered}")
    n, k = audited, tampered
    # C(N-k, n)/C(N, n) == C(N-n, k)/C(N, k): the smaller lower index keeps the integers small
    if n <= k:
        return Fraction(math.comb(population - k, n), math.comb(population, n))
    return Fraction(math.comb(population - n, k), math.comb(population, k))


def _log_miss(population: int, audited: int, tampered: int) -> float:
    """log of miss_probability in floats (lgamma; -inf where it is 0): a guide only, never a reported number."""
    if tampered > population - audited:
        return -math.inf
    g = math.lgamma
    return (g(population - tampered + 1) - g(population - tampered - audited + 1)
            - g(population + 1) + g(population - audited + 1))


def fewest_tampered(population: int, audited: int, below: Fraction) -> int:
    """The smallest k >= 1 whose miss probability is under `below` (it is for every larger k too)."""
    lo, hi = 1, population - audited + 1  # k = N - n + 1 cannot be missed: probability 0
    target = math.log(below)
    while lo < hi:  # a float bisection finds the neighbourhood; the exact checks below decide
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _log_miss(population, audited, mid) < target else (mid + 1, hi)
    k = min(lo, population - audited + 1)
    while k > 1 and miss_probability(population, audited, k - 1) < below:
        k -= 1
    while miss_probability(population, audited, k) >= below:
        k += 1
    return k


def percent(p: Fraction) -> str:
    """A probability as a percentage: one decimal (88.0%), or two significant digits where that would show 0.0%."""
    if p == 0:
        return "0%"
    tenths = round(p * 1000)  # exact: a Fraction rounds once, half to even
    if tenths:
        return f"{tenths // 10}.{tenths % 10}%"
    with localcontext() as ctx:
        ctx.prec, ctx.Emin = 2, -10**8  # exact integers in, so 10^-600 stays 10^-600 (a float would be 0)
        return f"{Decimal(p.numerator * 100) / Decimal(p.denominator):.1e}%"


def statement(sample: Sample, certified: int) -> str:
    """What the sample proves, in words, for the `certified` of its drawn segments that a replay certified."""
    n_pop, (first, end) = len(sample.population), sample.steps
    head = f"sampled {len(sample.drawn)} of {n_pop} segments (steps {first}..{end - 1}, seed {sample.seed})"
    if certified < len(sample.drawn):
        head += f", {certified} certified ({len(sample.drawn) - certified} refused or stale: not counted)"
    if certified == 0:
        return head + ": nothing certified, so this sample proves nothing"
    if certified == n_pop:
        return head + ": every segment certified, so no tampered segment can have been missed"
    one = percent(miss_probability(n_pop, certified, 1))
    fewest = {pct: fewest_tampered(n_pop, certified, Fraction(pct, 100)) for pct in THRESHOLDS}
    # where two thresholds need the same k, only the lower one is said (it implies the other)
    limits = "; ".join(f"if {k} or more, under {pct}%" for pct, k in fewest.items()
                       if not any(k == fewest[q] for q in THRESHOLDS if q < pct))
    return head + f": if 1 segment had been tampered, this sample misses it with probability {one}; {limits}"
