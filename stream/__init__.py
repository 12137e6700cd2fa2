"""The canonical, topologically invariant data stream (OPEN-1B report, section 2.3).

The tokens of every window are a pure function of the training seed and the corpus manifest: never of
world size, rank or machine. The training loop uses:

    import stream
    s = stream.open_stream("data/demo", seq_len=256, seed=42)     # verifies every shard digest first
    sched = stream.DEMO_BATCH                                    # or stream.OPEN_1B_BATCH, or your own
    lo, hi = sched.window_range(step)                            # the step's contiguous windows
    mine = sched.windows_for(step, rank, world)                  # window m belongs to rank m % world
    x = s.take(mine)                                             # int32 (len(mine), seq_len + 1)
    x = s.windows(lo, hi)                                        # or all of them, in order
    lr = stream.OPEN_1B_LR.at_step(step, sched)                  # token-anchored warmup + cosine
    state = s.state_for_step(step + 1, sched)                    # JSON-able, the same on every rank
    s.restore(state)                                             # bit-exact continuation
    s.seek_step(step, sched, stream.StateStore("runs/x/stream")) # nearest saved state, then forward

Reads are cheapest in ascending window order; going back needs a state (or `seek`). `s.state()` is
taken at `s.position` (after the last window read), which differs between ranks that `take` different
windows; checkpoints use `state_for_step` (or `state(window)`), a boundary every rank agrees on. Corpus tools:
`build_demo` (the embedded corpus, `python -m app data build-demo`), `prepare_corpus` (any JSON/TOML
corpus config), `step_provenance` (`python -m app data inspect --step N`).
"""
from __future__ import annotations

from pathlib import Path

from stream.errors import ConfigError, IntegrityError, StateError, StreamError
from stream.manifest import Manifest, build_manifest, load_manifest
from stream.schedule import (BATCH_PRESETS, DEMO_BATCH, DEMO_LR, LR_PRESETS, OPEN_1B_BATCH, OPEN_1B_LR,
                             BatchPhase, BatchSchedule, LRSchedule, windows_for)
from stream.state import MemoryStateStore, StateStore
from stream.store import ShardStore
from stream.windows import WindowStream


def open_stream(corpus_dir: str | Path, seq_len: int, seed: int, cache_dir: str | Path | None = None,
                verify: str = "open") -> WindowStream:
    """The window stream of the corpus at `corpus_dir` (its manifest.json); shards verified per `verify`."""
    manifest = load_manifest(corpus_dir)
    return WindowStream(manifest, ShardStore(manifest, cache_dir, verify), seq_len, seed)


def build_demo(out: str | Path, **kw) -> Manifest:
    """Build the embedded demo corpus (see stream.demo_corpus)."""
    from stream.demo_corpus import DemoConfig, build_demo as _build
    progress = kw.pop("progress", True)
    return _build(out, DemoConfig(**kw), progress=progress)


__all__ = ["open_stream", "build_demo", "WindowStream", "ShardStore", "Manifest", "load_manifest", "build_manifest",
           "BatchPhase", "BatchSchedule", "LRSchedule", "windows_for", "OPEN_1B_BATCH", "OPEN_1B_LR", "DEMO_BATCH",
           "DEMO_LR", "BATCH_PRESETS", "LR_PRESETS", "StateStore", "MemoryStateStore", "ConfigError",
           "IntegrityError", "StateError", "StreamError"]
