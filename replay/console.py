"""What `python -m app audit replay` runs: one segment replayed on this machine, the verdict printed.

Exit status: 0 MATCH, 1 MISMATCH, 2 refused input (a bad digest, a non-deterministic run, a foreign corpus).
"""
from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console


@dataclass(frozen=True)
class ReplayOptions:
    """Which steps to replay, and on what."""
    until_step: int  # the last step replayed (inclusive)
    from_checkpoint: int | None = None  # start at the run's checkpoint of this step (None: from the initialization)
    device: str = "cpu"
    backend: str = "ref"  # ref or triton (the Triton twins on CUDA): a MATCH means the same bits either way
    corpus: str | None = None  # read this copy of the corpus instead of the config's
    progress: bool = True
    threads: int = 0  # torch CPU threads (0: torch's default)


def replay_main(run: str, opts: ReplayOptions) -> int:
    """Replay steps [from_checkpoint or 0, until_step] (inclusive) of `run`; print MATCH or MISMATCH."""
    import torch

    from training.rundir import ckpt_dir, list_checkpoints
    from replay.core import replay_segment
    from replay.errors import AuditRefused

    if opts.threads:
        torch.set_num_threads(opts.threads)
    first = 0
    if opts.from_checkpoint is not None:
        if opts.from_checkpoint not in list_checkpoints(run):
            raise AuditRefused(f"{ckpt_dir(run, opts.from_checkpoint)}: no such checkpoint (have "
                               f"{list_checkpoints(run)})")
        first = opts.from_checkpoint
    r = replay_segment(run, first, opts.until_step + 1, device=opts.device, progress=opts.progress, corpus=opts.corpus,
                       backend=opts.backend)
    con = Console(soft_wrap=True)
    for note in r.notes:
        con.print(f"[yellow]note[/]: {note}")
    span = f"steps {r.start_step}..{r.end_step - 1} ({r.steps_replayed} replayed on {r.device}, {r.seconds:.1f} s)"
    if r.mismatch is None:
        con.print(f"[bold green]MATCH[/] {span}; chain after step {r.end_step - 1} {r.computed_chain}; "
                  f"run hash {r.run_hash}")
        return 0
    m = r.mismatch
    con.print(f"[bold red]MISMATCH[/] at step {m.step}, stage {m.stage}: {m.detail}")
    con.print(f"{span}; run hash {r.run_hash}")
    return 1
