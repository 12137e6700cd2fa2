"""The distributed collectives over gloo with 2, 3 and 4 local processes give the simulation's (TreeFold's) bits."""
import pytest

from collectives import CollectiveGroup, treefold
from collectives.selftest import digest, make_inputs, run_local

WORLDS = (2, 3, 4)
N = 4097  # not a multiple of 2, 3 or 4


@pytest.fixture(scope="module")
def runs():
    """Every world size at once (2 + 3 + 4 local processes over gloo): {world: per-rank results}."""
    return run_local(WORLDS, backend="gloo", n=N, seed=7)


@pytest.mark.parametrize("world", WORLDS)
def test_gloo_collectives_match_their_references(world, runs):
    rs = runs[world]
    assert [r["rank"] for r in rs] == list(range(world))
    for r in rs:
        assert r["backend"] == "gloo" and r["deterministic"] is True
        bad = [op for op, ok in r["ok"].items() if not ok]
        assert not bad, f"rank {r['rank']} of {world}: {bad} differ from the single-process reference"


@pytest.mark.parametrize("world", WORLDS)
def test_gloo_all_reduce_digest_is_this_process_treefold(world, runs):
    """Independent of the workers' own verdicts: their result digests equal TreeFold computed here."""
    ref = digest(treefold(make_inputs(world, N, seed=7)))
    assert {r["all_reduce_digest"] for r in runs[world]} == {ref}


@pytest.mark.parametrize("world", WORLDS)
def test_native_mode_is_marked_non_deterministic(world, runs):
    for r in runs[world]:
        assert r["native"]["deterministic"] is False and r["native"]["close"]


def test_init_needs_a_rendezvous():
    with pytest.raises(ValueError):
        CollectiveGroup.init(0, 2)
