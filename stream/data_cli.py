"""What `python -m app data ...` runs: building the demo corpus, preparing a corpus, inspecting a step."""
from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console

from stream.errors import ConfigError
from stream.schedule import BATCH_PRESETS, BatchPhase, BatchSchedule

DEFAULT_CORPUS = "data/demo"


def build_demo_main(out: str = DEFAULT_CORPUS, vocab_size: int = 4096) -> int:
    """`data build-demo`: write the embedded corpus and print its manifest digest."""
    from stream.demo_corpus import DemoConfig, build_demo

    console = Console(soft_wrap=True)
    t0 = time.perf_counter()
    m = build_demo(out, DemoConfig(vocab_size=vocab_size))
    for s in m.sources:
        console.print(f"{s.name:>6}: {len(s.shards)} shards, {s.documents} documents, {s.tokens} tokens")
    console.print(f"tokenizer blake3 {m.tokenizer_blake3} ({m.vocab_size} tokens)")
    console.print(f"manifest  blake3 {m.digest}")
    console.print(f"wrote {Path(out) / 'manifest.json'} in {time.perf_counter() - t0:.1f} s")
    return 0


def prepare_main(config: str, vocab_size: int) -> int:
    """`data prepare`: tokenizer (if absent) and manifest for a corpus config."""
    from stream.prepare import prepare_corpus

    m = prepare_corpus(config, vocab_size=vocab_size)
    Console(soft_wrap=True).print(f"manifest blake3 {m.digest} ({sum(s.tokens for s in m.sources)} tokens)")
    return 0


def inspect_main(step: int, corpus: str = DEFAULT_CORPUS, seq_len: int | None = None, seed: int = 42,
                 schedule: str = "demo", windows_per_step: int | None = None, world: int | None = None,
                 states: str | None = None, as_json: bool = False) -> int:
    """`data inspect --step N`: the documents behind every window of step N."""
    from stream import open_stream
    from stream.provenance import render, step_provenance
    from stream.state import StateStore

    if windows_per_step is not None:
        sched = BatchSchedule(seq_len or 256, (BatchPhase(1 << 62, windows_per_step),))
    elif schedule in BATCH_PRESETS:
        base = BATCH_PRESETS[schedule]
        sched = BatchSchedule(seq_len or base.seq_len, base.phases)
    else:
        raise ConfigError(f"--schedule: expected one of {sorted(BATCH_PRESETS)}, got {schedule!r}")
    if states and not Path(states).is_dir():
        raise ConfigError(f"--states {states}: no such directory; give the directory of saved stream states "
                          f"(state-<step>.json), or leave --states out to count windows from the start")
    s = open_stream(corpus, seq_len=sched.seq_len, seed=seed)
    if states:
        s.seek_step(step, sched, StateStore(states))
    rows = step_provenance(s, sched, step, world)
    if as_json:
        print(json.dumps(rows, indent=1))
    else:
        render(rows, step, sched.window_range(step),
               header=f"corpus {s.manifest.digest[:16]}  seed {seed}  seq_len {sched.seq_len}"
                      + (f"  world {world}" if world else ""))
    return 0
