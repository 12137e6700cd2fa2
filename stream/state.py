"""Resumable stream state: a small JSON record, independent of ranks, saved with checkpoints.

    {"format": "stream-state/1",
     "stream":  {"manifest": <corpus digest>, "seed": 42, "seq_len": 4096},   # whose state this is
     "window":  m,                      # the next window; the state sits at token m * (seq_len + 1)
     "documents": n,                    # documents started before that token (= mix draws used)
     "mix":     {"position": n, "bit_generator": {...numpy Philox state, canonical for n...}},
     "sources": {"web": {"epoch": e, "consumed": k}, ...},   # per source: epoch, documents used in it
     "partial": null | {"source", "shard", "document", "offset", "tokens", "blake3"}}

`partial` is the packing buffer's remainder: the tail of the last document started, from token
`offset` on; it is stored by reference with the blake3 of its tokens (a document can be long, the
record stays small) and checked on restore. States are saved per step in a `StateStore`: one JSON file
per step, written atomically, so seeking to step N restores the nearest saved state at or before N.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from stream.errors import StateError
from stream.fileio import atomic_write_json

STATE_FORMAT = "stream-state/1"
_KEYS = {"format", "stream", "window", "documents", "mix", "sources", "partial"}


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise StateError(f"stream state: {what} must be an int >= 0, got {v!r}")
    return v


def check_state(state: dict, identity: dict, sources: list[str]) -> dict:
    """Validate a state's shape and that it belongs to the stream `identity`; returns it."""
    if not isinstance(state, dict) or set(state) != _KEYS or state["format"] != STATE_FORMAT:
        raise StateError(f"stream state: expected a {STATE_FORMAT} record with keys {sorted(_KEYS)}")
    if state["stream"] != identity:
        raise StateError(f"stream state belongs to stream {state['stream']}, not {identity}")
    _int(state["window"], "window")
    _int(state["documents"], "documents")
    if not isinstance(state["sources"], dict) or sorted(state["sources"]) != sorted(sources):
        raise StateError(f"stream state: sources {sorted(state['sources'])} != corpus sources {sorted(sources)}")
    for name, s in state["sources"].items():
        if not isinstance(s, dict) or set(s) != {"epoch", "consumed"}:
            raise StateError(f"stream state: source {name!r} needs exactly 'epoch' and 'consumed'")
        _int(s["epoch"], f"sources.{name}.epoch")
        _int(s["consumed"], f"sources.{name}.consumed")
    p = state["partial"]
    if p is not None:
        if not isinstance(p, dict) or set(p) != {"source", "shard", "document", "offset", "tokens", "blake3"} \
                or p["source"] not in sources:
            raise StateError("stream state: malformed partial record")
        for k in ("shard", "document", "offset", "tokens"):
            _int(p[k], f"partial.{k}")
    return state


class MemoryStateStore:
    """States by step, in memory (tests, benchmarks, short-lived positioning)."""

    def __init__(self) -> None:
        self._states: dict[int, dict] = {}

    def save(self, step: int, state: dict) -> None:
        self._states[_int(step, "step")] = json.loads(json.dumps(state))  # a detached, JSON-clean copy

    def steps(self) -> list[int]:
        return sorted(self._states)

    def load(self, step: int) -> dict:
        if step not in self._states:
            raise StateError(f"no saved stream state for step {step}")
        return json.loads(json.dumps(self._states[step]))

    def nearest(self, step: int) -> tuple[int, dict] | None:
        """The saved state with the largest step <= `step`, or None."""
        best = max((s for s in self._states if s <= step), default=None)
        return None if best is None else (best, self.load(best))


class StateStore(MemoryStateStore):
    """States by step, one file `state-<step>.json` each in `directory` (fsynced unless `durable=False`)."""

    _NAME = re.compile(r"^state-(\d{12})\.json$")

    def __init__(self, directory: str | Path, durable: bool = True) -> None:
        self.directory, self.durable = Path(directory), durable

    def _path(self, step: int) -> Path:
        return self.directory / f"state-{_int(step, 'step'):012d}.json"

    def save(self, step: int, state: dict) -> None:
        atomic_write_json(self._path(step), state, self.durable)

    def steps(self) -> list[int]:
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := self._NAME.match(p.name)))

    def load(self, step: int) -> dict:
        path = self._path(step)
        if not path.is_file():
            raise StateError(f"no saved stream state for step {step} ({path})")
        try:
            return json.loads(path.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StateError(f"{path}: not valid JSON ({e}); delete it (the stream seeks from an earlier state)") \
                from None

    def nearest(self, step: int) -> tuple[int, dict] | None:
        best = max((s for s in self.steps() if s <= step), default=None)
        return None if best is None else (best, self.load(best))
