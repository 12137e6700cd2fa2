"""The documents behind a run's steps: stream/provenance.py's rows, read from the run's own corpus with its schedule
and seed, each with the text its tokens decode to. What `audit site` lists in its step views and
`python -m app data inspect --run RUN --step N` prints.

The corpus is the run's (replay.rundesc.locate_corpus: the config's `train.corpus`, else the path run.json recorded;
its manifest must carry the run's digest), or a copy named on purpose.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replay.errors import AuditRefused
from replay.rundesc import locate_corpus
from stream import BatchSchedule, WindowStream, open_stream
from stream.provenance import render, step_provenance
from stream.tokenizer import LoadedTokenizer, load_tokenizer
from training import rundir
from training.config import RunConfig

EXCERPT_CHARS = 600  # what is shown of a piece: enough to recognise the text, bounded per window
KEEP = ("window", "source", "shard", "document", "id", "doc_tokens", "tokens", "span", "span_unit")


def piece_tokens(stream: WindowStream, row: dict) -> np.ndarray:
    """The token ids of one provenance row: tokens [lo, hi) of its document (the separator where it reaches it)."""
    si = [s.name for s in stream.manifest.sources].index(row["source"])
    st = stream.store.get(si, row["shard_index"])
    base = int(st.offsets[row["document"]])
    lo, hi = row["tokens"]
    return st.tokens[base + lo:base + hi]


def piece_text(stream: WindowStream, tok: LoadedTokenizer, row: dict, limit: int = EXCERPT_CHARS) -> tuple[str, bool]:
    """(text, cut): what the row's tokens decode to, the document separator left out, cut to `limit` characters.
    Decoded from the tokens that fed the window, so it is exactly the span, wherever in its document it lies."""
    ids = piece_tokens(stream, row)
    text = tok.decode(ids[ids != tok.separator_id].tolist())
    return (text[:limit], True) if len(text) > limit else (text, False)


@dataclass
class RunStream:
    """A run's window stream, batch schedule and tokenizer."""

    corpus: Path
    stream: WindowStream
    batch: BatchSchedule
    tokenizer: LoadedTokenizer

    def documents(self, step: int, world: int | None = None) -> dict:
        """{"windows": [lo, hi], "pieces": [...]}: the step's (window, document) pieces in window order, each with
        its text (and, given `world`, the data-parallel rank that owns its window)."""
        pieces = []
        for row in step_provenance(self.stream, self.batch, step, world):
            text, cut = piece_text(self.stream, self.tokenizer, row)
            keep = KEEP + (("rank",) if world else ())
            pieces.append({**{k: row.get(k) for k in keep}, "text": text, "cut": cut})
        return {"windows": list(self.batch.window_range(step)), "pieces": pieces}


def open_run_stream(run: Path, cfg: RunConfig, desc: dict | None, corpus: str | Path | None = None) -> RunStream:
    """The run's stream (module doc); AuditRefused says why where the corpus is missing or not the run's. Shards are
    verified as they are first read (a drifted one raises the stream's IntegrityError, naming it)."""
    where, why = locate_corpus(run, cfg.train.corpus, desc, corpus)
    if where is None:
        raise AuditRefused(f"corpus not found: {why}")
    from training.step import schedules  # here: it imports torch, needed only when documents are read

    s = open_stream(where, seq_len=cfg.model.seq_len, seed=cfg.train.seed, verify="lazy")
    m = s.manifest
    tok = load_tokenizer(m.root / m.tokenizer_path, m.separator)  # the file open_stream verified
    return RunStream(where, s, schedules(cfg)[0], tok)


def inspect_main(run: str, step: int, corpus: str | None = None, world: int | None = None,
                 as_json: bool = False) -> int:
    """`data inspect --run RUN --step N`: the documents behind step N of the run, as a table with excerpts or JSON."""
    from rich.console import Console
    from rich.text import Text

    path = Path(run)
    cfg, _ = rundir.read_config(path)
    logged = (path / rundir.HASHLOG).read_bytes().count(b"\n") - 1 if (path / rundir.HASHLOG).is_file() else 0
    if not 0 <= step < logged:
        raise AuditRefused(f"{path / rundir.HASHLOG}: holds steps 0..{logged - 1}; --step {step} was not logged")
    rs = open_run_stream(path, cfg, rundir.read_run_json(path), corpus)
    docs = rs.documents(step, world)
    if as_json:
        print(json.dumps({"step": step, **docs}, indent=1, ensure_ascii=False))
        return 0
    console = Console(soft_wrap=True)
    render(docs["pieces"], step, tuple(docs["windows"]), console,
           header=f"run {path}  corpus {rs.corpus}  seed {cfg.train.seed}  seq_len {cfg.model.seq_len}")
    for p in docs["pieces"]:  # Text, not markup: a document's brackets are its own
        excerpt = " ".join(p["text"].split())
        console.print(Text(f"window {p['window']}, {p['source']} document {p['document']}: ", style="bold"),
                      Text(excerpt[:200] + (" ..." if p["cut"] or len(excerpt) > 200 else "")))
    return 0
