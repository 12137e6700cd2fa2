"""Audit: single-device replay of a run's steps (replay.core), batch audits on Ray Data (replay.batch).

`from replay import replay_segment, ReplayResult, Mismatch`; loaded lazily, so `python -m app` builds its
parser (app.audit_cli) without importing torch."""
from __future__ import annotations

__all__ = ["Mismatch", "ReplayResult", "replay_segment"]


def __getattr__(name: str):
    if name in __all__:
        from replay import core
        return getattr(core, name)
    raise AttributeError(f"module 'replay' has no attribute {name!r}")
