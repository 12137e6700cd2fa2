"""Sampled audits without Ray: the seeded draw, the fraction's validation, and the exact miss probability."""
import argparse
import itertools
import math
from collections import Counter
from fractions import Fraction

import blake3
import pytest

from app.argtypes import fraction
from replay.sampling import (Sample, draw, fewest_tampered, miss_probability, percent, reproduces, sample_size,
                             statement)
from training.errors import ConfigError

RUN_HASH = blake3.blake3(b"a run").hexdigest()
POPULATION = [(a, a + 10) for a in range(0, 1000, 10)]  # 100 segments of 10 steps


def test_draw_is_deterministic_and_depends_on_the_seed():
    first = draw(POPULATION, 0.12, 7, RUN_HASH)
    assert first == draw(list(reversed(POPULATION)), 0.12, 7, RUN_HASH), "the same draw, however the list is given"
    assert len(first.drawn) == 12 and list(first.drawn) == sorted(set(first.drawn))
    assert set(first.drawn) <= set(POPULATION)
    others = {draw(POPULATION, 0.12, seed, RUN_HASH).drawn for seed in range(8)}
    assert len(others) == 8, "every seed draws other segments"
    assert draw(POPULATION, 0.12, 7, blake3.blake3(b"another run").hexdigest()).drawn != first.drawn
    assert set(first.drawn) <= set(draw(POPULATION, 0.5, 7, RUN_HASH).drawn), "a larger fraction draws a superset"


def test_draw_is_the_documented_procedure():
    """The n segments whose blake3("<run hash>/<seed>/<a>:<b>") is smallest: reimplemented here from the words."""
    key = lambda s: blake3.blake3(f"{RUN_HASH}/3/{s[0]}:{s[1]}".encode()).hexdigest()  # noqa: E731
    assert draw(POPULATION, 0.05, 3, RUN_HASH).drawn == tuple(sorted(sorted(POPULATION, key=key)[:5]))


def test_each_segment_is_drawn_about_equally_often():
    counts = Counter(s for seed in range(3000) for s in draw(POPULATION[:10], 0.3, seed, RUN_HASH).drawn)
    assert len(counts) == 10 and all(abs(c - 900) < 120 for c in counts.values()), counts  # 900 +- 4 sigma


def test_fraction_is_validated():
    assert sample_size(0.1, 30) == 3 and sample_size(1, 7) == 7 and sample_size(0.01, 10) == 1
    assert sample_size(0.25, 10) == 3  # ceil(2.5)
    for bad in (0, -0.1, 1.5, math.nan):
        with pytest.raises(ConfigError, match="--sample"):
            sample_size(bad, 10)
    assert fraction("1") == 1.0 and fraction("0.25") == 0.25
    for bad in ("0", "-0.5", "1.01", "nan", "half"):
        with pytest.raises(argparse.ArgumentTypeError, match="0 < x <= 1"):
            fraction(bad)


@pytest.mark.parametrize("argv, names", [(["--sample", "0", "--seed", "1"], ["--sample", "0 < x <= 1"]),
                                         (["--sample", "2", "--seed", "1"], ["--sample"]),
                                         (["--sample", "0.5", "--seed", "-1"], ["--seed", ">= 0"]),
                                         (["--sample", "0.5"], ["--sample", "--seed"]),
                                         (["--seed", "4"], ["--sample", "--seed"])])
def test_bad_sample_arguments_are_one_line_and_exit_2(argv, names, capsys, tmp_path):
    from app.cli import main

    try:
        code = main(["audit", "batch", "--run", str(tmp_path), *argv])
    except SystemExit as e:  # argparse's refusal
        code = e.code
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and "error" in last and all(n in last for n in names), last


def test_miss_probability_by_hand():
    assert miss_probability(10, 3, 1) == Fraction(7, 10)  # the 7 undrawn of 10
    assert miss_probability(10, 3, 2) == Fraction(7, 10) * Fraction(6, 9)
    assert miss_probability(10, 3, 7) == Fraction(1, 120)  # only the 3 untampered drawn: 1 of C(10, 3)
    assert miss_probability(10, 3, 8) == 0 and miss_probability(10, 10, 1) == 0
    assert miss_probability(10, 3, 0) == 1


def test_miss_probability_counts_the_draws_that_miss():
    n_pop, n = 8, 3
    draws = list(itertools.combinations(range(n_pop), n))
    for k in range(n_pop + 1):  # the tampered segments: 0..k-1 (which ones does not matter)
        missed = sum(all(s >= k for s in d) for d in draws)
        assert miss_probability(n_pop, n, k) == Fraction(missed, len(draws))


def test_miss_probability_does_not_underflow():
    p = miss_probability(10**5, 50_000, 2_000)  # about 2^-2000: a float would be 0.0
    assert 0 < p < Fraction(1, 10**600) and float(p) == 0.0
    assert p == miss_probability(10**5, 50_000, 1_999) * Fraction(10**5 - 50_000 - 1_999, 10**5 - 1_999)
    assert percent(p).endswith("e-609%") and percent(Fraction(0)) == "0%"


@pytest.mark.parametrize("n_pop, n", [(100, 12), (10, 3), (10**5, 1), (10**5, 300), (10**5, 50_000), (7, 7)])
def test_fewest_tampered_is_where_the_miss_probability_drops_below(n_pop, n):
    for below in (Fraction(5, 100), Fraction(1, 100)):
        k = fewest_tampered(n_pop, n, below)
        assert miss_probability(n_pop, n, k) < below
        assert k == 1 or miss_probability(n_pop, n, k - 1) >= below


def test_statement_in_words():
    s = draw(POPULATION, 0.12, 7, RUN_HASH)
    # 12 of 100: k=21 misses with 4.88% (k=20: 5.74%), k=31 with 0.84% (k=30: 1.01%)
    assert statement(s, 12) == ("sampled 12 of 100 segments (steps 0..999, seed 7): if 1 segment had been tampered, "
                                "this sample misses it with probability 88.0%; if 21 or more, under 5%; if 31 or more, "
                                "under 1%")
    assert "11 certified (1 refused or stale: not counted)" in statement(s, 11) and "89.0%" in statement(s, 11)
    assert statement(s, 0).endswith("proves nothing")
    assert statement(draw(POPULATION[:4], 1, 0, RUN_HASH), 4).endswith("no tampered segment can have been missed")


def test_sample_round_trips_and_refuses_what_was_not_drawn():
    s = draw(POPULATION, 0.1, 11, RUN_HASH)
    assert Sample.from_json(s.to_json()) == s and reproduces(s, RUN_HASH)
    picked = Sample(s.population, s.fraction, s.seed, tuple(POPULATION[:10]))
    assert not reproduces(picked, RUN_HASH) and not reproduces(s, blake3.blake3(b"another run").hexdigest())
    with pytest.raises(ConfigError, match="population"):
        Sample(((0, 4), (5, 8)), 0.5, 1, ((0, 4),))  # not contiguous: a gap could hide steps
    with pytest.raises(ConfigError, match="drawn"):
        Sample(((0, 4), (4, 8)), 0.5, 1, ((0, 4), (4, 8)))  # two where 0.5 of 2 draws one


def test_a_threshold_reached_by_the_same_k_as_a_lower_one_is_not_repeated():
    s = draw([(0, 1), (1, 2), (2, 3), (3, 4)], 0.5, 2, RUN_HASH)  # 2 of 4: k=3 cannot be missed (k=2: 1/6)
    assert statement(s, 2).endswith("probability 50.0%; if 3 or more, under 1%")
