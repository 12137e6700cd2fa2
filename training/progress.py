"""The trainer's live display: a rich progress bar with step, tokens/s, loss and the chain-hash prefix."""
from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """`with StepProgress(total, start, seq_len) as bar: bar.update(record, seconds)`; silent when disabled."""

    def __init__(self, total: int, start: int, seq_len: int, enabled: bool = True) -> None:
        self.seq_len = seq_len
        self._p = Progress(TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                           TextColumn("{task.fields[info]}"), disable=not enabled)
        self._task = self._p.add_task("train", total=total, completed=start, info="")

    def __enter__(self) -> "StepProgress":
        self._p.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._p.__exit__(*exc)

    def update(self, rec: dict, seconds: float) -> None:
        lo, hi = rec["windows"]
        tok_s = (hi - lo) * self.seq_len / seconds if seconds > 0 else 0.0
        skip = "[yellow]skip[/] " if rec["skipped"] else ""
        info = f"{tok_s:,.0f} tok/s  loss {rec['loss']:.4f}  |g| {rec['grad_norm']:.3f}  {skip}chain {rec['chain_hash'][:12]}"
        self._p.update(self._task, advance=1, info=info)
