"""Batch audits on a local Ray cluster: a 12-step tiny run audited in 3 segments (checkpoints every 4),
certificates on parquet, two jobs merged, a tampered log, another run's certificates, cross-hardware.

The second hardware kind is simulated: a job whose auditors ask for the `cpu_arm` resource the fixture
advertises and record their kind as cpu_arm (`kind_override`, marked "override" in the certificate). Real
ARM certificates come from an ARM node (see docs/audit.md)."""
import os
import shutil
from pathlib import Path

import pytest

from training.presets import TINY
from training.rundir import list_checkpoints
from training.train import TrainOptions, train
from replay.batch import BatchOptions, plan_segments, run_batch
from replay.certificates import SCHEMA, RunLog, read_certificates, read_sample
from replay.coverage import coverage_of
from replay.sampling import draw

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray instance for this module's tests, advertising two simulated hardware kinds."""
    import ray

    ray.init(address="local", num_cpus=4, resources={"cpu_x86": 2, "cpu_arm": 2}, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    from stream import build_demo

    out = tmp_path_factory.mktemp("demo-corpus")
    build_demo(out, vocab_size=TINY.model.vocab_size, progress=False)
    return out


def _cli(argv: list[str]) -> int:
    """`python -m app ...` in this process (so it uses the module's Ray instance)."""
    from app.cli import main

    return main(argv)


def _train(corpus: Path, out: Path, steps: int, seed: int = 42) -> Path:
    cfg = TINY.replace(**{"train.corpus": str(corpus), "train.seed": seed})
    train(cfg, out, TrainOptions(steps=steps, checkpoint_every=4, eval_every=0, progress=False))
    return out


@pytest.fixture(scope="session")
def run12(corpus, tmp_path_factory) -> Path:
    """tiny, 12 steps, checkpoints after steps 4, 8 and 12."""
    return _train(corpus, tmp_path_factory.mktemp("runs") / "a", 12)


@pytest.fixture(scope="module")
def audited(ray_cluster, run12):
    """The whole run audited once, on the cpu_x86 slots."""
    return run_batch(run12, BatchOptions("0:12", segment=4, kind="cpu_x86", progress=False))


def test_three_segments_all_match_with_full_certificates(audited, run12):
    assert audited.segments == [(0, 4), (4, 8), (8, 12)]
    rows = read_certificates(audited.path)
    assert audited.path.parent == run12 / "audit" / "certificates" and audited.path.name == f"{audited.job_id}.parquet"
    log = RunLog(run12)
    assert [(r["first_step"], r["end_step"], r["verdict"]) for r in rows] == [(0, 4, "MATCH"), (4, 8, "MATCH"),
                                                                              (8, 12, "MATCH")]
    for r in rows:
        assert r["run_hash"] == log.run_hash and r["job_id"] == audited.job_id
        assert r["expected_chain"] == r["computed_chain"] == log.chain(r["end_step"] - 1)
        assert r["start_checkpoint"] == r["first_step"]  # every segment starts on a checkpoint (or init)
        assert r["kind"] == "cpu_x86" and r["kind_source"] == "detected" and r["device"] == "cpu"
        assert r["cpu_isa"].startswith("x86_64/") and r["torch_version"] and r["hostname"] and r["seconds"] > 0
        assert r["mismatch_step"] is None and r["mismatch_stage"] is None
    assert set(SCHEMA.names) <= set(rows[0])


def test_second_kind_merges_and_marks_cross_hardware(audited, run12):
    job = run_batch(run12, BatchOptions("4:8", segment=4, resources={"cpu_arm": 1}, kind_override="cpu_arm",
                                         progress=False))
    assert [r["verdict"] for r in job.rows] == ["MATCH"] and job.rows[0]["kind_source"] == "override"
    cov = coverage_of(run12)
    assert cov.verdict == "VERIFIED: every step 0..11 certified MATCH"
    assert {(s["first"], s["end"]): s["cross_hardware"] for s in cov.segments()} == {
        (0, 4): False, (4, 8): True, (8, 12): False}
    assert {c["job_id"] for c in cov.certs} == {audited.job_id, job.job_id}


def test_tampered_state_hash_fails_its_segment(ray_cluster, run12, tmp_path):
    bad = tmp_path / "tampered"
    shutil.copytree(run12, bad, ignore=shutil.ignore_patterns("audit"))
    lines = (bad / "hashlog.jsonl").read_text().splitlines()
    rec = lines[1 + 5]  # step 5 (line 0 is the init record)
    i = rec.index('"state_hash":"') + len('"state_hash":"')
    lines[6] = rec[:i] + ("0" if rec[i] != "0" else "1") + rec[i + 1:]
    (bad / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    assert _cli(["audit", "batch", "--run", str(bad), "--steps", "0:12", "--segment", "4", "--no-progress"]) == 1
    cov = coverage_of(bad)
    assert cov.verdict == "FAILED at step 5"
    [cert] = [c for c in cov.certs if c["verdict"] == "MISMATCH"]
    assert (cert["first_step"], cert["end_step"], cert["mismatch_step"], cert["mismatch_stage"]) == (4, 8, 5, "state")
    assert "state hash" in cert["mismatch_detail"] and cert["computed_chain"] != cert["expected_chain"]
    assert sorted(c["verdict"] for c in cov.certs) == ["MATCH", "MATCH", "MISMATCH"]
    assert (bad / "audit" / "coverage.png").stat().st_size > 0


def test_another_runs_certificates_are_ignored(audited, corpus, run12, tmp_path):
    other = _train(corpus, tmp_path / "other", 4, seed=7)
    job = run_batch(other, BatchOptions("0:4", progress=False))
    assert [r["verdict"] for r in job.rows] == ["MATCH"]
    stray = run12 / "audit" / "certificates" / f"zz-other-{job.path.name}"
    shutil.copy(job.path, stray)
    try:
        cov = coverage_of(run12)
        assert any(stray.name in w and "not this run's" in w for w in cov.warnings)
        assert all(c["run_hash"] == RunLog(run12).run_hash for c in cov.certs) and cov.verdict.startswith("VERIFIED")
        assert _cli(["audit", "coverage", "--run", str(run12)]) == 0
        assert (run12 / "audit" / "coverage.png").stat().st_size > 0
    finally:
        stray.unlink()


def test_corrupt_checkpoint_is_a_refused_certificate(ray_cluster, run12, tmp_path):
    bad = tmp_path / "flipped"
    shutil.copytree(run12, bad, ignore=shutil.ignore_patterns("audit"))
    f = bad / "checkpoints" / "step-000000000004" / "params.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1  # one bit of the last parameter
    f.write_bytes(bytes(data))
    assert _cli(["audit", "batch", "--run", str(bad), "--steps", "4:8", "--no-progress"]) == 2
    [cert] = read_certificates(next((bad / "audit" / "certificates").glob("*.parquet")))
    assert cert["verdict"] == "REFUSED" and "params.safetensors" in cert["mismatch_detail"]
    assert coverage_of(bad).verdict == "INCOMPLETE: 0/12 steps certified"


def test_a_sampled_audit_replays_only_its_draw(ray_cluster, run12, tmp_path, capsys):
    """`audit batch --sample 0.5 --seed 5` with 2-step segments: 3 of the 6 drawn, replayed and certified, their file
    holding the sample; `audit coverage` says what the sample proves."""
    run = Path(shutil.copytree(run12, tmp_path / "run", ignore=shutil.ignore_patterns("audit")))
    assert _cli(["audit", "batch", "--run", str(run), "--segment", "2", "--sample", "0.5", "--seed", "5",
                 "--kind", "cpu_x86", "--no-progress"]) == 0
    [path] = (run / "audit" / "certificates").glob("*.parquet")
    expected = draw(plan_segments(0, 12, 2, list_checkpoints(run)), 0.5, 5, RunLog(run).run_hash)
    assert read_sample(path) == expected and len(expected.drawn) == 3
    rows = read_certificates(path)
    assert [(r["first_step"], r["end_step"], r["verdict"]) for r in rows] == [(a, b, "MATCH")
                                                                              for a, b in expected.drawn]
    capsys.readouterr()
    assert _cli(["audit", "coverage", "--run", str(run)]) == 3  # INCOMPLETE: 6 of 12 steps
    out = " ".join(capsys.readouterr().out.split())
    assert "sampled 3 of 6 segments (steps 0..11, seed 5): if 1 segment had been tampered, this sample misses it " \
           "with probability 50.0%" in out, out


def test_refused_arguments_exit_2(ray_cluster, run12):
    assert _cli(["audit", "batch", "--run", str(run12), "--steps", "0:13"]) == 2
    assert _cli(["audit", "batch", "--run", str(run12), "--kind", "gpu_nvidia"]) == 2  # the cluster has none


def test_a_healthy_batch_audit_prints_no_error(ray_cluster, run12, tmp_path):
    """`python -m app audit batch` as a user runs it: MATCH, and no line of its output is an error: no ERROR, no
    Traceback, no error line of Ray's core worker ("[time E pid tid] file.cc:N: ..."). With Ray Data's default
    restarts for the auditor pool, that worker logs one at the first auditor (its constructor arguments live in the
    object store). The job joins this module's cluster, where a driver's core worker logs to a file, unless
    RAY_LOG_TO_STDERR=1 sends it to stderr, as when the command starts its own Ray instance."""
    import re
    import subprocess
    import sys

    run = Path(shutil.copytree(run12, tmp_path / "run", ignore=shutil.ignore_patterns("audit")))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "RAY_LOG_TO_STDERR": "1"}
    address = ray_cluster.get_runtime_context().gcs_address
    p = subprocess.run([sys.executable, "-m", "app", "audit", "batch", "--run", str(run), "--steps", "0:2",
                        "--address", address, "--kind", "cpu_x86", "--no-progress"],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300)  # the auditors import from cwd
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "1 MATCH" in out, out[-4000:]
    bad = [ln for ln in out.splitlines()
           if "ERROR" in ln or "Traceback" in ln or re.match(r"\[[^\]]* [EF] \d+ \d+\]", ln)]
    assert not bad, "\n".join(bad)
