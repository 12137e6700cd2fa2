"""What `python -m app audit replay` runs: one segment replayed on this machine, the verdict printed.

Exit status: 0 MATCH, 1 MISMATCH, 2 refused input (a bad digest, a non-deterministic run, a foreign corpus).
"""
from __future__ import annotations

from rich.console import Console


def replay_main(run: str, until_step: int, from_checkpoint: int | None = None, device: str = "cpu",
                corpus: str | None = None, progress: bool = True, threads: int = 0, backend: str = "ref") -> int:
    """Replay steps [from_checkpoint or 0, until_step] (inclusive) of `run`; print MATCH or MISMATCH."""
    import torch

    from training.checkpoint import ckpt_dir, list_checkpoints
    from replay.core import replay_segment
    from replay.errors import AuditRefused

    if threads:
        torch.set_num_threads(threads)
    first = 0
    if from_checkpoint is not None:
        if from_checkpoint not in list_checkpoints(run):
            raise AuditRefused(f"{ckpt_dir(run, from_checkpoint)}: no such checkpoint (have "
                               f"{list_checkpoints(run)})")
        first = from_checkpoint
    r = replay_segment(run, first, until_step + 1, device=device, progress=progress, corpus=corpus, backend=backend)
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
