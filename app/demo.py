"""`make demo`: the op library's self-check, then the tiny model trained on the embedded corpus (built if
missing), then its report."""
from __future__ import annotations

from pathlib import Path

from app.presets import TINY


def _free_run_dir(base: str = "runs/demo") -> str:
    """The first runs/demo-N that does not exist (runs are never overwritten)."""
    n = 1
    while Path(f"{base}-{n}").exists():
        n += 1
    return f"{base}-{n}"


def main(steps: int = 200, out: str | None = None, workers: str | None = None) -> int:
    """`workers` (e.g. "2"): train on Ray Train workers of a local Ray instance this process starts and stops
    (micro_batch 1, so the tiny batch of 2 windows splits over 2 workers)."""
    from kernels.selfcheck import main as selfcheck
    from stream import data_cli

    from app import report, train

    if selfcheck([]):
        return 1  # no training on an op library that fails its own digests or bounds
    corpus = Path(TINY.train.corpus)
    if not (corpus / "manifest.json").is_file():
        data_cli.build_demo_main(str(corpus), TINY.model.vocab_size)
    run = out or _free_run_dir()
    if workers:
        import ray

        from app import ray_train
        try:
            ray_train.main("tiny", steps, run, workers, checkpoint_every=100, eval_every=25, micro_batch=1, threads=1)
        finally:
            ray.shutdown()
    else:
        train.main("tiny", steps, run, checkpoint_every=100, eval_every=25)
    return report.main(run)
