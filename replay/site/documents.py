"""The documents behind chosen steps of a run, for the site's step view (replay/documents.py: stream/provenance.py's
rows with the text of each piece, from the run's own corpus, schedule and seed).

Bounded by design: only the steps asked for (`--documents-steps A:B`, default the first 50) and the steps where
an audit found a MISMATCH, so a site of 10^5 steps does not decode 10^5 steps of text. A missing or foreign
corpus is not an error: the step view says why it lists no documents.
"""
from __future__ import annotations

from pathlib import Path

from replay.documents import open_run_stream
from replay.errors import AuditRefused
from stream import StreamError
from training.config import RunConfig
from training.errors import ConfigError

DEFAULT_STEPS = "0:50"


def parse_step_range(text: str, n_steps: int) -> tuple[int, int]:
    """`A:B` -> [A, min(B, n_steps)); A:B with A == B selects no step. ConfigError names --documents-steps."""
    a, sep, b = text.partition(":")
    try:
        lo = int(a) if a.strip() else 0
        hi = int(b) if b.strip() else n_steps
    except ValueError:
        raise ConfigError(f"--documents-steps: expected A:B (steps A..B-1), got {text!r}") from None
    if not sep or not 0 <= lo <= hi:
        raise ConfigError(f"--documents-steps {text}: need 0 <= A <= B (steps A..B-1)")
    return min(lo, n_steps), min(hi, n_steps)


def step_documents(run: Path, cfg: RunConfig, desc: dict | None, steps: list[int],
                   corpus: str | Path | None = None) -> tuple[dict[int, dict], str]:
    """({step: {"windows": [lo, hi], "pieces": [row + text]}}, a note saying why there are none, or "")."""
    if not steps:
        return {}, ""
    out: dict[int, dict] = {}
    try:
        rs = open_run_stream(run, cfg, desc, corpus)
        for step in sorted(steps):  # ascending: the stream reads forward
            out[step] = rs.documents(step)
    except AuditRefused as e:  # the corpus is missing or not the run's
        return {}, str(e)
    except (StreamError, OSError) as e:  # a shard that drifted or went missing: named, and no text shown
        return out, f"corpus: {e}"
    return out, ""
