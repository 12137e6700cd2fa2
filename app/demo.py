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


def main(steps: int = 200, out: str | None = None) -> int:
    from kernels.selfcheck import main as selfcheck
    from stream import data_cli

    from app import report, train

    if selfcheck([]):
        return 1  # no training on an op library that fails its own digests or bounds
    corpus = Path(TINY.train.corpus)
    if not (corpus / "manifest.json").is_file():
        data_cli.build_demo_main(str(corpus), TINY.model.vocab_size)
    run = out or _free_run_dir()
    train.main("tiny", steps, run, checkpoint_every=100, eval_every=25)
    return report.main(run)
