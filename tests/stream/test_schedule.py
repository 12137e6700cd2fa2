import math
import random

import numpy as np
import pytest

import stream
from stream.errors import ConfigError
from stream.schedule import (OPEN_1B_BATCH, OPEN_1B_LR, PI, BatchPhase, BatchSchedule, LRSchedule, cos,
                             windows_for)
from tests.stream.conftest import SEED, SEQ_LEN

SCHED = BatchSchedule(SEQ_LEN, (BatchPhase(3_000, 6), BatchPhase(30_000, 12), BatchPhase(10 ** 9, 20)))


def test_open_1b_table_4():
    assert [p.windows_per_step for p in OPEN_1B_BATCH.phases] == [768, 1152, 2304]
    assert OPEN_1B_BATCH.steps_for(400_000_000_000) == 80_957  # the report's step count
    assert OPEN_1B_BATCH.window_range(0) == (0, 768)
    # the warmup batch holds until 4B tokens: step 1271 starts below, step 1272 at/after the boundary
    assert OPEN_1B_BATCH.tokens_before(1271) < 4_000_000_000 <= OPEN_1B_BATCH.tokens_before(1272)
    assert OPEN_1B_BATCH.window_range(1272)[1] - OPEN_1B_BATCH.window_range(1272)[0] == 1152
    assert OPEN_1B_BATCH.window_range(80_956)[1] - OPEN_1B_BATCH.window_range(80_956)[0] == 2304
    assert OPEN_1B_BATCH.tokens_through(80_956) == 400_004_481_024


def test_window_ranges_tile_the_stream():
    prev = 0
    for step in range(400):
        a, b = SCHED.window_range(step)
        assert a == prev and b > a
        prev = b
        assert SCHED.steps_for(SCHED.tokens_through(step)) == step + 1


def test_every_world_size_reads_the_same_windows_in_the_same_order(tiny_corpus):
    """Acceptance: for R in 1..8, the windows of a step ordered by m are identical to R = 1."""
    rng = random.Random(7)
    steps = sorted(rng.sample(range(0, 600), 12))
    states = stream.MemoryStateStore()
    ref_stream = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    for step in range(0, 601, 25):  # the run a trainer does: states every 25 steps
        ref_stream.seek_step(step, SCHED)
        states.save(step, ref_stream.state())
    ranks = {R: [stream.open_stream(tiny_corpus, SEQ_LEN, SEED) for _ in range(R)] for R in range(2, 9)}
    for step in steps:
        a, b = SCHED.window_range(step)
        s1 = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
        s1.seek_step(step, SCHED, states)
        ref = s1.windows(a, b)
        after = s1.state_for_step(step + 1, SCHED)
        assert list(windows_for(step, 0, 1, SCHED)) == list(range(a, b))
        for R, streams in ranks.items():
            got = np.empty_like(ref)
            seen = []
            for r, s in enumerate(streams):  # each rank its own stream object, as on its own host
                mine = SCHED.windows_for(step, r, R)
                assert all(m % R == r for m in mine)
                s.seek_step(step, SCHED, states)
                got[[m - a for m in mine]] = s.take(mine)
                seen += list(mine)
            assert sorted(seen) == list(range(a, b))
            assert got.tobytes() == ref.tobytes(), (step, R)
            assert all(s.state_for_step(step + 1, SCHED) == after for s in streams)  # rank-independent state


def test_windows_for_validates():
    with pytest.raises(ConfigError, match="rank"):
        windows_for(0, 3, 3, SCHED)
    with pytest.raises(ConfigError, match="world"):
        windows_for(0, 0, 0, SCHED)


def test_cos_matches_libm_to_1e15_without_calling_it():
    rng = random.Random(3)
    xs = [rng.uniform(-100, 100) for _ in range(20_000)] + [rng.uniform(0, PI) for _ in range(20_000)]
    xs += [0.0, PI, -PI, PI / 2, 1e-300, 1e5 + 0.5] + [k * PI / 4 for k in range(-16, 17)]
    assert max(abs(cos(x) - math.cos(x)) for x in xs) < 1e-15
    with pytest.raises(ValueError):
        cos(1e7)


def test_lr_schedule_is_token_anchored():
    lr = OPEN_1B_LR
    assert lr.warmup_tokens == 667 * 3_145_728
    # warmup: linear, full peak reached at step 666 (the 667th step of the warmup batch)
    assert lr.at_step(0, OPEN_1B_BATCH) == 4.5e-4 * (3_145_728 / lr.warmup_tokens)
    assert lr.at_step(666, OPEN_1B_BATCH) == 4.5e-4
    assert lr.at_step(665, OPEN_1B_BATCH) < 4.5e-4
    # cosine to 10% of peak at the budget, and flat after it
    assert lr.at_tokens(400_000_000_000) == pytest.approx(4.5e-5, rel=1e-15)
    assert lr.at_step(80_956, OPEN_1B_BATCH) == 4.5e-5
    mid = (lr.warmup_tokens + lr.budget_tokens) // 2
    assert lr.at_tokens(mid) == pytest.approx(4.5e-5 + (4.5e-4 - 4.5e-5) * 0.5, rel=1e-12)
    vals = [lr.at_tokens(t) for t in range(lr.warmup_tokens, lr.budget_tokens, 10 ** 9)]
    assert all(a >= b for a, b in zip(vals, vals[1:]))
    # against the libm formula, to rounding
    for t in range(lr.warmup_tokens, lr.budget_tokens, 7 * 10 ** 9):
        p = (t - lr.warmup_tokens) / (lr.budget_tokens - lr.warmup_tokens)
        assert lr.at_tokens(t) == pytest.approx(4.5e-5 + 4.05e-4 * 0.5 * (1 + math.cos(math.pi * p)), rel=1e-14, abs=0)


@pytest.mark.parametrize("make, field", [
    (lambda: BatchPhase(0, 4), "until_tokens"),
    (lambda: BatchPhase(10, 0), "windows_per_step"),
    (lambda: BatchPhase.of(10, 4, 0, 2), "dp_degree"),
    (lambda: BatchSchedule(0, (BatchPhase(10, 1),)), "seq_len"),
    (lambda: BatchSchedule(8, (BatchPhase(10, 1), BatchPhase(10, 2))), "increase"),
    (lambda: BatchSchedule(8, ()), "phases"),
    (lambda: LRSchedule(0.0, 1, 2), "peak"),
    (lambda: LRSchedule(1e-3, 5, 5), "budget_tokens"),
    (lambda: LRSchedule(1e-3, 1, 5, 1.5), "final_fraction"),
])
def test_bad_config_values_name_the_field(make, field):
    with pytest.raises(ConfigError, match=field):
        make()
