"""The CI scenario, which is also `make demo`'s story (app/demo.py): the tiny model trained on elastic Ray Train
workers of a local cluster of simulated nodes, resized from 1 to 2 workers when a second slot joins, then every step
batch-audited on the same cluster: 100% MATCH, the run VERIFIED. `make demo` runs 200 steps with the slot joining
after step 100 (checkpoints every 25); this runs 80 with it joining after step 20 (checkpoints every 20): the same
story, with 60 steps for the new node to come up and the resize to land, and 40% of the training and replay. The
audit replays every step (in its recorded topology, 1x1 or 2x1) from the run's verified checkpoints and compares
state and chain hashes, so the resize is checked where it matters: the steps after it."""
import json
import os
import re
from pathlib import Path

import pytest

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")

pytestmark = pytest.mark.slow
STEPS, GROW_AT, EVERY = 80, 20, 20


def _jsonl(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def test_elastic_run_resized_midway_is_verified_by_its_audit(tiny, tmp_path, capfd):
    pytest.importorskip("ray")
    from rich.console import Console

    from app.demo import story
    from replay.certificates import read_certificates

    run = tmp_path / "demo"
    out = story(tiny, run, STEPS, GROW_AT, console=Console(quiet=True), progress=False, eval_every=0,
                checkpoint_every=EVERY)

    assert out.summary["steps"] == STEPS and out.grew_at is not None and out.grew_at >= GROW_AT
    log = _jsonl(run / "hashlog.jsonl")
    assert len(log) == STEPS + 1 and [r["step"] for r in log[1:]] == list(range(STEPS))
    # windows consecutive: none skipped or repeated across the resize
    assert all(a["windows"][1] == b["windows"][0] for a, b in zip(log[1:], log[2:])) and log[1]["windows"][0] == 0
    groups = [(e["world"], e["from_step"]) for e in _jsonl(run / "metrics.jsonl") if e["event"] == "workers"]
    assert [w for w, _ in groups] == [1, 2], groups
    resumed = groups[1][1]
    # a checkpoint after the slot joined; which one depends on how long the new node takes to come up (on a
    # loaded 2-core CI machine that can outlast the steps between checkpoints), so no upper bound but the run's
    assert resumed % EVERY == 0 and GROW_AT <= resumed < STEPS
    topo = [r["topology"] for r in log[1:]]
    assert topo == ["1x1"] * resumed + ["2x1"] * (STEPS - resumed)  # every step's topology recorded
    for aside in run.glob("hashlog.before-resume-*.jsonl"):  # steps redone after the resize were re-checked
        chains = {r["step"]: r["chain_hash"] for r in log[1:]}
        before = _jsonl(aside)
        assert all(r["chain_hash"] == chains[r["step"]] for r in before if r["step"] >= 0)
        assert max(r["step"] for r in before) < resumed + EVERY  # the group resumed at the latest checkpoint

    cov = out.coverage
    assert cov.verdict.startswith("VERIFIED"), cov.verdict
    assert cov.certified == STEPS and cov.first_mismatch is None
    rows = [r for p in (run / "audit" / "certificates").glob("*.parquet") for r in read_certificates(p)]
    assert rows and all(r["verdict"] == "MATCH" for r in rows)
    assert sorted((r["first_step"], r["end_step"]) for r in rows)[0][0] == 0
    assert sum(r["end_step"] - r["first_step"] for r in rows) == STEPS  # every step certified exactly once
    assert (run / "audit" / "coverage.png").stat().st_size > 0
    # what `make demo` shows besides its own output (this process's and its Ray processes' file descriptors): no
    # error line, no traceback, no core-worker error line ("[time E pid tid] file.cc:N: ...")
    shown = "".join(capfd.readouterr()).splitlines()
    bad = [ln for ln in shown if "ERROR" in ln or "Traceback" in ln or re.match(r"\[[^\]]* [EF] \d+ \d+\]", ln)]
    assert not bad, "\n".join(bad[:20])
