"""The documents behind chosen steps of a run, for the site's step view: stream/provenance.py's rows (window,
source, shard, document, token and byte spans) with the text of each piece, from the run's own corpus, schedule
and seed.

Bounded by design: only the steps asked for (`--documents-steps A:B`, default the first 50) and the steps where
an audit found a MISMATCH, so a site of 10^5 steps does not decode 10^5 steps of text. A missing or foreign
corpus is not an error: the step view says why it lists no documents.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from replay.rundesc import find_corpus
from stream import StreamError, WindowStream, open_stream
from stream.provenance import step_provenance
from stream.tokenizer import LoadedTokenizer, load_tokenizer
from training.config import RunConfig
from training.errors import ConfigError

DEFAULT_STEPS = "0:50"
EXCERPT_CHARS = 600  # what a step view shows of a piece: enough to recognise the text, bounded per window
KEEP = ("window", "source", "shard", "document", "id", "doc_tokens", "tokens", "span", "span_unit")


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


def step_documents(run: Path, cfg: RunConfig, desc: dict | None, steps: list[int],
                   corpus: str | Path | None = None) -> tuple[dict[int, dict], str]:
    """({step: {"windows": [lo, hi], "pieces": [row + text]}}, a note saying why there are none, or "")."""
    if not steps:
        return {}, ""
    where, why = find_corpus(run, cfg.train.corpus, desc, corpus)
    if where is None:
        return {}, f"corpus not found: {why}"
    from training.step import schedules  # here: it imports torch, needed only when documents are listed

    batch, _ = schedules(cfg)
    out: dict[int, dict] = {}
    try:
        s = open_stream(where, seq_len=cfg.model.seq_len, seed=cfg.train.seed, verify="lazy")
        m = s.manifest
        tok = load_tokenizer(m.root / m.tokenizer_path, m.separator)  # the file open_stream verified
        for step in sorted(steps):  # ascending: the stream reads forward
            pieces = []
            for row in step_provenance(s, batch, step):
                text, cut = piece_text(s, tok, row)
                pieces.append({**{k: row.get(k) for k in KEEP}, "text": text, "cut": cut})
            out[step] = {"windows": list(batch.window_range(step)), "pieces": pieces}
    except (StreamError, OSError) as e:  # a shard that drifted or went missing: named, and no text shown
        return out, f"corpus {where}: {e}"
    return out, ""
