import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

import stream
from stream.errors import StateError
from stream.fileio import blake3_bytes
from tests.stream.conftest import SEED, SEQ_LEN
from tests.stream.test_schedule import SCHED


def test_restore_at_random_steps_reproduces_the_next_windows_bit_for_bit(tiny_corpus):
    rng = random.Random(11)
    ref = stream.open_stream(tiny_corpus, SEQ_LEN, SEED).windows(0, SCHED.window_range(420)[1])
    run = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    for step in sorted(rng.sample(range(1, 400), 15)):
        a, _ = SCHED.window_range(step)
        run.advance(a)
        state = json.loads(json.dumps(run.state()))  # through JSON, as a checkpoint stores it
        fresh = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
        fresh.restore(state)
        b = SCHED.window_range(step + 20)[1]
        assert fresh.windows(a, b).tobytes() == ref[a:b].tobytes()
        assert fresh.state(a) == state


def test_state_is_small_rank_independent_and_json(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    s.windows(0, 1234)
    st = s.state()
    assert st["window"] == 1234 and set(st["sources"]) == {"web", "code", "math"}
    assert sum(v["epoch"] * n + v["consumed"] for v, n in zip(st["sources"].values(), (150, 60, 90))) == st["documents"]
    assert st["mix"]["position"] == st["documents"]
    assert len(json.dumps(st)) < 2048
    # the state at a boundary does not depend on how far generation ran ahead
    t = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    t.windows(0, 1234)
    t.windows(1234, 5000)
    u = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    u.advance(1234)
    assert u.state() == st


def test_partial_window_buffer_is_carried(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    found = 0
    for w in range(1, 200):
        st = s.state(w)
        if st["partial"] is not None:
            found += 1
            p = st["partial"]
            assert 0 < p["offset"] and p["tokens"] > 0
    assert found > 50  # most boundaries cut a document


def test_wrong_stream_or_tampered_state_is_refused(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    s.advance(100)
    st = s.state()
    for other in (stream.open_stream(tiny_corpus, SEQ_LEN, SEED + 1), stream.open_stream(tiny_corpus, SEQ_LEN + 1, SEED)):
        with pytest.raises(StateError, match="belongs to stream"):
            other.restore(st)
    bad = json.loads(json.dumps(st))
    bad["documents"] += 1
    with pytest.raises(StateError):
        s.restore(bad)
    bad = json.loads(json.dumps(st))
    bad["mix"]["bit_generator"]["state"]["counter"][0] += 1
    with pytest.raises(StateError, match="mix"):
        s.restore(bad)
    if st["partial"]:
        bad = json.loads(json.dumps(st))
        bad["partial"]["blake3"] = "0" * 64
        with pytest.raises(StateError, match="partial"):
            s.restore(bad)
    with pytest.raises(StateError):
        s.restore({"format": "nope"})


def test_seek_uses_the_nearest_saved_state_on_disk(tiny_corpus, tmp_path):
    store = stream.StateStore(tmp_path / "states")
    run = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    for step in range(0, 301, 10):
        run.seek_step(step, SCHED)
        store.save(step, run.state())
    assert store.steps() == list(range(0, 301, 10))
    assert store.nearest(257)[0] == 250 and store.nearest(5)[0] == 0
    ref = stream.open_stream(tiny_corpus, SEQ_LEN, SEED).windows(0, SCHED.window_range(299)[1])
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    s.seek_step(257, SCHED, store)
    assert s._n0 > 0  # restored, not replayed from the start
    a, b = SCHED.window_range(257)
    assert np.array_equal(s.windows(a, b), ref[a:b])
    s.seek_step(3, SCHED, store)  # backwards: from the state of step 0
    a, b = SCHED.window_range(3)
    assert np.array_equal(s.windows(a, b), ref[a:b])
    assert not list((tmp_path / "states").glob("*.tmp"))


SCRIPT = """
import sys, json
sys.path.insert(0, '.')
import stream
from stream.fileio import blake3_bytes
s = stream.open_stream(sys.argv[1], 32, 1234)
w = s.windows(0, 700)
print(blake3_bytes(w.astype('<i4').tobytes()), blake3_bytes(json.dumps(s.state(), sort_keys=True).encode()))
"""


def test_fresh_processes_with_different_hash_seeds_agree(tiny_corpus):
    s = stream.open_stream(tiny_corpus, SEQ_LEN, SEED)
    w = s.windows(0, 700)
    here = [blake3_bytes(w.astype("<i4").tobytes()), blake3_bytes(json.dumps(s.state(), sort_keys=True).encode())]
    outs = []
    for seed in ("1", "4242"):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"} | {"PYTHONHASHSEED": seed}
        r = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_corpus)], capture_output=True, text=True, env=env,
                           check=True)
        outs.append(r.stdout.split())
    assert outs[0] == outs[1] == here
