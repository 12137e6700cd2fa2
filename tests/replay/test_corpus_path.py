"""A run's identity does not depend on where its corpus lies: the state hash carries the corpus by its manifest
digest. Two runs of one corpus at two paths write the same hash log; a run replays and resumes from a copy; an
audit that cannot find the corpus names every place it looked; and a batch audit submitted with `ray job submit`
(whose working copy has no data/) finds the corpus a run with a relative corpus path read."""
import shutil
import sys
import time
from pathlib import Path

import pytest
import yaml

from replay.compare import compare_main
from replay.core import replay_segment
from replay.errors import AuditRefused
from training.presets import TINY
from training.rundir import HASHLOG
from training.train import TrainOptions, train

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


def _train(corpus: str | Path, out: Path, steps: int = STEPS, resume: bool = False) -> Path:
    cfg = TINY.replace(**{"train.corpus": str(corpus)})
    train(cfg, out, TrainOptions(steps=steps, checkpoint_every=2, eval_every=0, progress=False), resume=resume)
    return out


@pytest.fixture(scope="module")
def two_places(demo_corpus, tmp_path_factory, one_thread) -> dict[str, Path]:
    """The demo corpus copied to two paths and a run trained from each."""
    tmp = tmp_path_factory.mktemp("places")
    a, b = shutil.copytree(demo_corpus, tmp / "a"), shutil.copytree(demo_corpus, tmp / "elsewhere" / "b")
    return {"a": a, "b": b, "run_a": _train(a, tmp / "run_a"), "run_b": _train(b, tmp / "run_b")}


def test_the_same_corpus_at_two_paths_writes_the_same_hash_log(two_places):
    assert (two_places["run_a"] / HASHLOG).read_bytes() == (two_places["run_b"] / HASHLOG).read_bytes()
    assert compare_main(str(two_places["run_a"]), str(two_places["run_b"])) == 0  # IDENTICAL


def test_a_moved_corpus_is_found_by_run_json_or_given_and_the_run_resumes_from_it(two_places, tmp_path, one_thread):
    run = shutil.copytree(two_places["run_a"], tmp_path / "run")
    moved = shutil.move(str(two_places["a"]), tmp_path / "moved")
    try:
        with pytest.raises(AuditRefused, match=r"corpus: .*pass --corpus DIR") as refused:
            replay_segment(run, 0, STEPS)
        assert str(two_places["a"]) in str(refused.value)  # names where it looked
        assert replay_segment(run, 0, STEPS, corpus=moved).verdict == "MATCH"
        _train(moved, run, STEPS + 2, resume=True)  # the config's path is gone; the corpus is the same
        longer = _train(two_places["b"], tmp_path / "longer", STEPS + 2)
        assert (run / HASHLOG).read_bytes() == (longer / HASHLOG).read_bytes()
    finally:
        shutil.move(moved, two_places["a"])


def _job_status(client, job_id: str, timeout: float) -> str:
    from ray.job_submission import JobStatus

    deadline = time.time() + timeout
    while time.time() < deadline:
        status = client.get_job_status(job_id)
        if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            return str(status)
        time.sleep(1)
    return "TIMEOUT"


def _checkout_zip(dst: Path) -> str:
    """The checkout's code as a job ships it (no data, runs or local environments), zipped under one top-level
    folder, as a file:// URI a job's working_dir can name."""
    shutil.copytree(ROOT, dst / "checkout", ignore=shutil.ignore_patterns(".git", ".venv", ".whl", "data", "runs",
                                                                         "cache", "scratch", "results",
                                                                         "__pycache__", "*.png"))
    return "file://" + shutil.make_archive(str(dst / "checkout"), "zip", root_dir=dst, base_dir="checkout")


@pytest.mark.slow
def test_a_ray_job_audits_a_run_with_a_relative_corpus_path(demo_corpus, tmp_path, monkeypatch, one_thread,
                                                             submit_job, ray_temp_dir):
    from ray.job_submission import JobSubmissionClient

    from app.local_cluster import LocalCluster

    work = tmp_path / "work"
    shutil.copytree(demo_corpus, work / "data" / "demo")
    monkeypatch.chdir(work)
    run = _train("data/demo", tmp_path / "run")  # config.json says "data/demo"
    monkeypatch.chdir(tmp_path)
    env = yaml.safe_load((ROOT / "runtime_env.yaml").read_text())  # what a job ships: the checkout without data/
    # the working copy as a zip the head reads from this machine's disk: `ray job submit` would upload the folder
    # into the head's GCS, from which the job's Ray Data actors, under a full suite's load, at times failed to
    # fetch it ("Failed to download runtime_env file package"; a fresh head each time did not help). The job
    # runs from the same unpacked copy either way.
    env.pop("excludes")  # the copy leaves those out already; Ray takes excludes only for a local folder
    env["working_dir"] = _checkout_zip(tmp_path)
    with LocalCluster(head_cpus=2, slots=0, dashboard=True, temp_dir=ray_temp_dir) as head:
        client = JobSubmissionClient(head.dashboard_url)
        job = submit_job(client, entrypoint=f"{sys.executable} -m app audit batch --run {run} --segment 2 "
                                            f"--no-progress", runtime_env=env)
        status = _job_status(client, job, timeout=300)
        logs, info = client.get_job_logs(job), client.get_job_info(job)
    assert status == "SUCCEEDED", f"{info.message}\n{logs[-3000:]}"
    assert "2 MATCH" in logs, logs[-3000:]
