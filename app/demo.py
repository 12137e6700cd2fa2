"""`make demo`: the whole story on the embedded default, on one machine.

1. the op library's self-check (no training on ops that fail their own digests or bounds);
2. the embedded demo corpus (built if missing);
3. a local Ray cluster of simulated nodes (app/local_cluster.py): a head and one training slot;
4. the tiny model trained on elastic Ray Train workers (1..2): a second slot joins mid-run, Ray Train
   resizes the worker group from 1 to 2 workers, which resume from the last checkpoint and re-check the
   steps they redo against the log;
5. a batch audit of every step on the same cluster (Ray Data, one certificate per segment), the coverage
   table, the run's verdict and hash;
6. the cluster is stopped, and the run's report (loss curve, gradient-norm table) is written.

`--local` trains in this process instead (steps 3-5 skipped). The story is also the CI scenario
(tests/app/test_demo_story.py), so what the README promises is what CI checks.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from training.config import RunConfig
from training.presets import TINY
from training.ray_auth import auth_mode

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported

GROW_AT = 100  # the second slot joins once the checkpoint of this step is written


def _free_run_dir(base: str = "runs/demo") -> str:
    """The first runs/demo-N that does not exist (runs are never overwritten)."""
    n = 1
    while Path(f"{base}-{n}").exists():
        n += 1
    return f"{base}-{n}"


def _logged_steps(run: Path) -> int:
    """Step records in the run's hash log so far (the init record excluded)."""
    p = run / "hashlog.jsonl"
    if not p.exists():
        return 0
    with p.open("rb") as f:
        return max(0, sum(1 for line in f if line.strip()) - 1)


@dataclass
class StoryOutcome:
    summary: dict  # the training run's end record
    coverage: object  # replay.coverage.Coverage after the audit
    grew_at: int | None  # the logged step count when the second slot joined


def train_elastic(cluster, cfg: RunConfig, out: Path, steps: int, grow_at: int | None, console,
                  checkpoint_every: int = 25, eval_every: int = 25, resize_interval_s: float = 2.0) -> tuple[dict, int | None]:
    """Train on 1..2 Ray Train workers of `cluster`; add a slot once the checkpoint of step `grow_at` exists
    (so the grown group resumes there, unless the resize takes longer than `checkpoint_every` steps)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from training.rundir import list_checkpoints
    from app.local_cluster import WORKER_RESOURCES
    from training.ray_train import train_ray
    from training.train import TrainOptions

    opts = TrainOptions(steps, checkpoint_every, eval_every, progress=False)
    result: dict = {}

    def go() -> None:
        try:
            result["summary"] = train_ray(cfg, out, opts, (1, 2), max_failures=3, threads=1,
                                          resize_interval_s=resize_interval_s,
                                          resources_per_worker=dict(WORKER_RESOURCES))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            result["error"] = e

    th = threading.Thread(target=go, name="train_ray", daemon=True)
    grew_at = None
    cols = (TextColumn("[bold]train {task.fields[run]}"), MofNCompleteColumn(), TextColumn("steps"), BarColumn(),
            TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*cols, console=console) as bar:
        task = bar.add_task("train", total=steps, run=out.name, info="1 slot")
        th.start()
        while th.is_alive():
            n = _logged_steps(out)
            if grow_at is not None and grew_at is None and n >= grow_at and grow_at in list_checkpoints(out):
                cluster.add_slot()  # a machine joins: Ray Train's resize monitor grows the group to 2 workers
                grew_at = n
            bar.update(task, completed=n, info=f"{len(cluster.slots)} slot(s)")
            th.join(timeout=0.5)
        bar.update(task, completed=_logged_steps(out))
    if "error" in result:
        raise result["error"]
    return result["summary"], grew_at


def story(cfg: RunConfig, out: str | Path, steps: int = 200, grow_at: int | None = GROW_AT, console=None,
          progress: bool = True, eval_every: int = 25, checkpoint_every: int = 25) -> StoryOutcome:
    """Steps 3-5 of the module doc on `cfg` (its corpus must exist); the cluster is stopped on return."""
    from rich.console import Console

    from app.local_cluster import LocalCluster
    from replay.batch import BatchOptions, run_batch
    from replay.coverage import coverage_of, draw_coverage, print_coverage

    console = console or Console(soft_wrap=True)
    out = Path(out).resolve()
    with LocalCluster(head_cpus=2, slots=1) as cluster:
        console.print(f"[bold]local Ray cluster[/]: head + {len(cluster.slots)} training slot; "
                      f"a second slot joins after step {grow_at}")
        summary, grew_at = train_elastic(cluster, cfg, out, steps, grow_at, console, checkpoint_every, eval_every)
        console.print(f"run {out}: {summary['steps']} steps, {_worker_groups(out)}; {_losses(out)}")
        job = run_batch(out, BatchOptions(progress=progress), console=console)  # every step, on the same cluster
        console.print(f"audit job {job.job_id}: {len(job.rows)} segments; certificates {job.path}")
    cov = coverage_of(out)
    print_coverage(cov, console)
    console.print(f"coverage map: {draw_coverage(cov)}")
    return StoryOutcome(summary, cov, grew_at)


def _losses(run: Path) -> str:
    """'loss 8.329 -> 6.724' over the whole hash log (a resumed group's summary sees only its own steps)."""
    from training.rundir import read_jsonl

    recs = [r for r in read_jsonl(run / "hashlog.jsonl") if r["step"] >= 0]
    return f"loss {recs[0]['loss']:.3f} -> {recs[-1]['loss']:.3f}"


def _worker_groups(run: Path) -> str:
    """'workers: 1 from step 0, 2 from step 100' from the run's metrics."""
    from training.rundir import read_jsonl
    from training.train import METRICS

    groups = [r for r in read_jsonl(run / METRICS) if r.get("event") == "workers"]
    return "workers: " + ", ".join(f"{g['world']} from step {g['from_step']}" for g in groups)


def main(steps: int = 200, out: str | None = None, workers: str | None = None, local: bool = False) -> int:
    """`python -m app demo`: exit 0 when the run is VERIFIED by its audit."""
    from kernels.selfcheck import main as selfcheck
    from stream import data_cli

    from replay.coverage import exit_code
    from training import report, train
    from training.train import TrainOptions

    if selfcheck([]):
        return 1
    corpus = Path(TINY.train.corpus)
    if not (corpus / "manifest.json").is_file():
        data_cli.build_demo_main(str(corpus), TINY.model.vocab_size)
    run = out or _free_run_dir()
    opts = TrainOptions(steps, checkpoint_every=100, eval_every=25)
    if local:
        train.main(TINY, run, opts)
        return report.main(run)
    cfg = TINY  # any worker count splits its windows; no bit depends on how each cuts them (training/windows.py)
    if workers:  # a fixed worker count on a plain local Ray instance (docs/cluster.md)
        import ray

        from training import ray_train
        try:
            cluster = ray_train.ClusterOptions(ray_train.parse_workers(workers))
            ray_train.main(cfg, run, TrainOptions(steps, 100, 25, progress=False, threads=1), cluster)
        finally:
            ray.shutdown()
        return report.main(run)
    outcome = story(cfg, run, steps, grow_at=min(GROW_AT, steps // 2))
    report.main(run)
    return exit_code(outcome.coverage.verdict)
