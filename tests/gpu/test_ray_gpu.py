"""Ray Train workers on the GPU: two workers sharing one GPU (half of it each, gloo on its CUDA tensors) train
`small-parity` with the Triton backend; the hash log is the one-process GPU run's, record for record but for the
topology, and the committed CPU log's trajectory. Then a worker is killed mid-run: the group restarts from the last
checkpoint, re-checks the steps it recomputes, and the chain holds."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

from replay.compare import CODE_BOUND  # noqa: E402  (what only the code version changes)
from training.presets import SMALL_PARITY  # noqa: E402
from training.ray_train import train_ray  # noqa: E402
from training.rundir import HASHLOG, read_jsonl  # noqa: E402
from training.train import TrainOptions, train  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CPU_LOG = ROOT / "docs" / "results" / "parity-small-parity-cpu-code1b2ec819.hashlog.jsonl"
STEPS = 50


@pytest.fixture(scope="module")
def corpus() -> Path:
    """The committed CPU log's corpus: PARITY_CORPUS, else data/demo (built if missing). The demo corpus is made
    from the interpreter's standard library, so a GPU machine with another Python needs the one the log was
    trained on copied to it."""
    path = Path(os.environ.get("PARITY_CORPUS", ROOT / "data" / "demo"))
    if not (path / "manifest.json").exists():
        from stream import build_demo

        build_demo(path, vocab_size=SMALL_PARITY.model.vocab_size, progress=False)
    return path


def _cfg(corpus: Path):
    return SMALL_PARITY.replace(**{"train.corpus": str(corpus)})


def _without(rec: dict, *keys: str) -> dict:
    return {k: v for k, v in rec.items() if k not in keys}


@pytest.fixture(scope="module")
def ray_gpu():
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def one_process(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("gpu") / "one"
    train(_cfg(corpus), out, TrainOptions(STEPS, checkpoint_every=0, eval_every=0, device="cuda",
                                               backend="triton", progress=False))
    return out


def _train_ray(cfg, out: Path, **kw) -> dict:
    return train_ray(cfg, out, TrainOptions(STEPS, checkpoint_every=10, eval_every=0, device="cuda", backend="triton",
                                            progress=False), (2, 2), threads=2, gpus_per_worker=0.5, **kw)


def test_two_workers_sharing_a_gpu_write_the_one_process_log(ray_gpu, one_process, corpus, tmp_path):
    s = _train_ray(_cfg(corpus), tmp_path / "ray")
    assert s["steps"] == STEPS
    got, want = read_jsonl(tmp_path / "ray" / HASHLOG), read_jsonl(one_process / HASHLOG)
    assert len(got) == STEPS + 1 and {r["topology"] for r in got[1:]} == {"2x1"}
    assert [_without(r, "topology") for r in got] == [_without(r, "topology") for r in want]
    # the committed CPU log: the same trajectory (the same hashes too, where it was recorded by this code version)
    cpu = [json.loads(x) for x in CPU_LOG.read_text().splitlines()[:STEPS + 1]]
    same_code = cpu[0]["code_version"] == got[0]["code_version"]
    drop = ("topology",) if same_code else ("topology", *CODE_BOUND)
    assert [_without(r, *drop) for r in got] == [_without(r, *drop) for r in cpu]


def _train_worker_pids() -> list[int]:
    """The pids of this machine's Ray Train workers, by the process title Ray gives an actor ("ray::RayTrainWorker...").
    Not ray.util.state: that asks the dashboard, which a GPU machine without Ray's optional packages does not run."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            title = (proc / "cmdline").read_bytes().split(b"\0")[0]
        except (OSError, ValueError):
            continue  # gone, or not a process
        if title.startswith(b"ray::") and b"TrainWorker" in title:
            pids.append(int(proc.name))
    return sorted(pids)


def test_a_killed_worker_restarts_the_group_and_the_chain_holds(ray_gpu, one_process, corpus, tmp_path):
    run = tmp_path / "killed"
    result: dict = {}

    def go():
        try:
            result["summary"] = _train_ray(_cfg(corpus), run, max_failures=2, step_delay_s=0.3)
        except BaseException as e:  # noqa: BLE001 - reported below
            result["error"] = e

    th = threading.Thread(target=go)
    th.start()
    deadline = time.time() + 300
    while time.time() < deadline and len(read_jsonl(run / HASHLOG)) < 15:  # past the checkpoint of step 10
        time.sleep(0.2)
    workers = _train_worker_pids()
    assert workers, "no Ray Train worker found"
    os.kill(workers[-1], signal.SIGKILL)
    th.join(timeout=600)
    assert not th.is_alive(), "the run did not finish"
    assert "error" not in result, result.get("error")
    restarts = [r for r in read_jsonl(run / "metrics.jsonl") if r.get("event") == "workers"]
    assert len(restarts) >= 2 and restarts[-1]["from_step"] >= 10  # the group came back from a checkpoint
    got, want = read_jsonl(run / HASHLOG), read_jsonl(one_process / HASHLOG)
    assert [_without(r, "topology") for r in got] == [_without(r, "topology") for r in want]
