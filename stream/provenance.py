"""Provenance: which documents fed each window of a step (source, shard, document, token and byte ranges).

This is the user-facing end of an audit: given a step, name the exact text its gradients came from.
A row is one (window, document) piece; `bytes` is the document's range in the shard file (for
.jsonl.zst, in the decompressed stream: `zstd -dc SHARD | tail -c +START+1 | head -c LEN`), `rows`
for parquet.
"""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from stream.readers import read_bytes_zst
from stream.schedule import BatchSchedule
from stream.sources import shard_format
from stream.windows import WindowStream


def step_provenance(stream: WindowStream, schedule: BatchSchedule, step: int, world: int | None = None,
                    with_ids: bool = True) -> list[dict]:
    """One record per (window, document) piece of step `step`, in window order; `rank` when `world` is given."""
    start, end = schedule.window_range(step)
    stream.seek(start)
    seg = stream.segments(start, end)
    m = stream.manifest
    raw_cache: dict[tuple[int, int], bytes] = {}
    rows = []
    for i in range(seg["window"].size):
        si, h, d = int(seg["src"][i]), int(seg["shard"][i]), int(seg["doc"][i])
        src = m.sources[si]
        entry = src.shards[h]
        st = stream.store.get(si, h)
        b0, b1 = (int(x) for x in st.spans[d])
        row = {"step": step, "window": int(seg["window"][i]), "source": src.name, "shard": entry.path,
               "shard_index": h, "document": d, "doc_tokens": int(seg["doc_tokens"][i]),
               "tokens": [int(seg["tok_lo"][i]), int(seg["tok_hi"][i])], "span": [b0, b1], "span_unit": st.unit}
        if world:
            row["rank"] = row["window"] % world
        if with_ids and shard_format(entry.path) != "parquet":
            # the record's own "id" field, when it has one: read back from the verified shard bytes
            if (si, h) not in raw_cache:
                data = m.shard_file(entry).read_bytes()
                raw_cache[(si, h)] = read_bytes_zst(data) if entry.path.endswith(".zst") else data
            try:
                rec = json.loads(raw_cache[(si, h)][b0:b1])
                row["id"] = rec.get("id") if isinstance(rec, dict) else None
            except ValueError:
                row["id"] = None
        rows.append(row)
    return rows


def render(rows: list[dict], step: int, window_range: tuple[int, int], console: Console | None = None,
           header: str = "") -> None:
    """Print the provenance of a step as a rich table, one section per window."""
    console = console or Console()
    t = Table(title=f"step {step}: windows [{window_range[0]}, {window_range[1]})" + (f"\n{header}" if header else ""),
              caption="span: the document's line in the shard, in bytes (decompressed for .zst) or rows (parquet)")
    has_rank = any("rank" in r for r in rows)
    for c in ["window"] + (["rank"] if has_rank else []) + ["source", "shard", "doc", "id", "doc tokens", "span"]:
        t.add_column(c, justify="right" if c in ("window", "rank", "doc") else "left", overflow="fold")
    for i, r in enumerate(rows):
        first = i == 0 or rows[i - 1]["window"] != r["window"]
        last = i + 1 == len(rows) or rows[i + 1]["window"] != r["window"]
        unit = "rows " if r["span_unit"] == "row" else ""
        t.add_row(*([str(r["window"]) if first else ""] + ([str(r["rank"]) if first else ""] if has_rank else []) + [
            r["source"], r["shard"].rsplit("/", 1)[-1], str(r["document"]), str(r.get("id") or ""),
            f"[{r['tokens'][0]}, {r['tokens'][1]}) / {r['doc_tokens']}", f"{unit}[{r['span'][0]}, {r['span'][1]})"]),
            end_section=last)
    console.print(t)
