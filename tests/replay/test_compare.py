"""`audit compare`: two hash logs read as an auditor reads them (replay/compare.py)."""
from __future__ import annotations

import json

import blake3
import pytest

from app.cli import main
from training.rundir import JsonlLog
from replay.compare import broken_link, compare_logs
from replay.errors import AuditRefused


def _records(steps: int, code: str = "c0", config: str = "cfg", loss_at: dict | None = None,
             digest_at: dict | None = None) -> list[dict]:
    """A chained log: each state hash covers the code version, the config and the step's numbers."""
    loss_at, digest_at = loss_at or {}, digest_at or {}
    chain = bytes(32)
    out = []
    for step in range(-1, steps):
        rec = {"step": step, "tokens": 64 * (step + 1)}
        if step < 0:
            rec["code_version"] = code
        else:
            rec["loss"] = loss_at.get(step, 8.0 - step / 8)
            rec["digests"] = {s: digest_at.get((step, s), f"{s}-{step}") for s in ("forward", "backward", "optimizer")}
        state = blake3.blake3(json.dumps([code, config, rec], sort_keys=True).encode()).digest()
        chain = blake3.blake3(chain + state).digest()
        out.append({**rec, "state_hash": state.hex(), "chain_hash": chain.hex()})
    return out


def _write(tmp_path, name: str, records: list[dict]):
    run = tmp_path / name
    run.mkdir()
    with JsonlLog(run / "hashlog.jsonl") as log:
        for r in records:
            log.append(r)
    return run


def test_identical_logs(tmp_path):
    a, b = _write(tmp_path, "a", _records(6)), _write(tmp_path, "b", _records(6))
    c = compare_logs(a, b / "hashlog.jsonl")  # a run directory or the file itself
    assert (c.verdict, c.exit_code) == ("IDENTICAL", 0) and "byte-identical" in c.detail


def test_a_code_version_change_alone_is_the_same_trajectory(tmp_path):
    a, b = _write(tmp_path, "a", _records(6)), _write(tmp_path, "b", _records(6, code="c1"))
    assert broken_link(_records(6)) is None
    c = compare_logs(a, b)
    assert (c.verdict, c.exit_code) == ("SAME TRAJECTORY", 3), c.detail
    assert "6 steps" in c.detail and "stage digest" in c.detail


@pytest.mark.parametrize("code", ["c0", "c1"])
def test_a_number_or_a_digest_that_differs_is_named(tmp_path, code):
    a = _write(tmp_path, "a", _records(6))
    b = _write(tmp_path, "b", _records(6, code=code, loss_at={3: 7.5}))
    c = compare_logs(a, b)
    assert (c.verdict, c.exit_code) == ("DIFFERENT", 1) and c.detail.startswith("step 3: fields ['loss']"), c.detail
    d = _write(tmp_path, "d", _records(6, code=code, digest_at={(4, "backward"): "other"}))
    c = compare_logs(a, d)
    assert c.verdict == "DIFFERENT" and "step 4" in c.detail and "'backward'" in c.detail, c.detail


def test_state_hashes_that_differ_under_one_code_version(tmp_path):
    """Equal numbers and digests, one code version, different state hashes: what the log does not show
    (here the config) differs, so this is not the same trajectory."""
    a, b = _write(tmp_path, "a", _records(4)), _write(tmp_path, "b", _records(4, config="other"))
    c = compare_logs(a, b)
    assert c.verdict == "DIFFERENT" and "one code version" in c.detail, c.detail


def test_a_log_that_stops_early_is_compared_over_the_common_steps(tmp_path):
    a, b = _write(tmp_path, "a", _records(8)), _write(tmp_path, "b", _records(5, code="c1"))
    c = compare_logs(a, b)
    assert c.verdict == "SAME TRAJECTORY" and "5 common steps" in c.detail and c.lengths == (9, 6), c.detail
    assert compare_logs(a, _write(tmp_path, "p", _records(5))).verdict == "IDENTICAL"


def test_a_broken_chain_or_a_missing_log_is_refused(tmp_path):
    recs = _records(5, code="c1")
    recs[3]["state_hash"] = "00" * 32
    a, b = _write(tmp_path, "a", _records(5)), _write(tmp_path, "b", recs)
    with pytest.raises(AuditRefused, match=r"b/hashlog.jsonl: the hash chain breaks at step 2"):
        compare_logs(a, b)
    assert main(["audit", "compare", str(a), str(tmp_path / "nowhere")]) == 2
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    with pytest.raises(AuditRefused, match="list.jsonl: expected records for steps -1, 0, 1"):
        compare_logs(a, tmp_path / "list.jsonl")


def test_cli_exit_status(tmp_path, capsys):
    a, b = _write(tmp_path, "a", _records(3)), _write(tmp_path, "b", _records(3, code="c1"))
    assert main(["audit", "compare", str(a), str(b)]) == 3
    assert capsys.readouterr().out.startswith("SAME TRAJECTORY: ")
    assert main(["audit", "compare", str(a), str(a)]) == 0


def _recut(records: list[dict], topology_at) -> list[dict]:
    """The same records with each step's topology label set by `topology_at(step)` (the hashes untouched:
    the cut is not an input of the state hash)."""
    return [r if r["step"] < 0 else {**r, "topology": topology_at(r["step"])} for r in records]


def test_a_resized_run_is_the_same_bits(tmp_path):
    a = _write(tmp_path, "a", _recut(_records(6), lambda s: "1x1"))
    b = _write(tmp_path, "b", _recut(_records(6), lambda s: "3x1" if s < 3 else "2x1"))
    c = compare_logs(a, b)
    assert (c.verdict, c.exit_code) == ("SAME BITS", 0), c.detail
    assert "(1x1 from step 0 vs 3x1 from step 0, 2x1 from step 3)" in c.detail, c.detail
    # a number that differs as well is still named, and so is a code version change beside the cut
    d = _write(tmp_path, "d", _recut(_records(6, loss_at={4: 1.0}), lambda s: "2x1"))
    assert compare_logs(a, d).detail.startswith("step 4: fields ['loss']")
    e = compare_logs(a, _write(tmp_path, "e", _recut(_records(6, code="c1"), lambda s: "2x2")))
    assert e.verdict == "SAME TRAJECTORY" and e.detail.endswith("cut differently (1x1 from step 0 vs 2x2 from step 0)")
