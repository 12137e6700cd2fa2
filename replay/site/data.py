"""The site's data files: JSON, each wrapped in one call `SITE.receive(name, data)` (site.js), so that pages opened
from file:// can load them (a browser refuses fetch() of local files, not a script). json.dumps escapes every
non-ASCII character, U+2028 included, so a file is a valid script whatever the run's strings hold.

    data/run.js            the run's name, step count, statuses, how steps are chunked, the documents' range
    data/steps.js          the steps table, by column (10^5 steps: a few MB)
    data/certificates.js   every certificate that vouches for the log, with its `audit replay` line
    data/steps/NNNNNN.js   the step view's records, CHUNK steps a file (NNNNNN = step // CHUNK)
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np

from replay.site.commands import replay_command
from replay.site.status import STATUS_NAMES, mismatch_parts
from replay.site.view import RunView

CHUNK = 1000


def write_data(path: Path, name: str, value: object) -> None:
    """`value` as a data file of the site (module doc)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(value, ensure_ascii=True, separators=(",", ":"))  # NaN/Infinity are JavaScript too
    path.write_text(f"SITE.receive({json.dumps(name)},{text});\n", encoding="ascii")


def _short(x: object) -> object:
    """A table's number: 6 significant digits (the step view shows the logged value)."""
    return float(f"{x:.6g}") if isinstance(x, float) else x


def steps_table(view: RunView, codes: np.ndarray, label: np.ndarray, labels: list[str]) -> dict:
    recs = view.records
    topologies = list(dict.fromkeys(r["topology"] for r in recs))
    index = {t: i for i, t in enumerate(topologies)}
    return {"n": len(recs), "topologies": topologies, "topology": [index[r["topology"]] for r in recs],
            "windows": [r["windows"][1] - r["windows"][0] for r in recs], "tokens": [r["tokens"] for r in recs],
            "loss": [_short(r["loss"]) for r in recs], "skipped": [int(bool(r.get("skipped"))) for r in recs],
            "status": codes.tolist(), "label": label.tolist(), "labels": labels}


def certificates(view: RunView, run: str) -> list[dict]:
    """The certificates that vouch for the log (stale and other runs' are left out: the overview warns of them)."""
    out = []
    for c in view.coverage.certs:
        out.append({**c, "kind_label": view.coverage.kind_label(c["kind"]), "command": replay_command(c, run),
                    "parts": mismatch_parts(c["mismatch_detail"]) if c["verdict"] == "MISMATCH" else None})
    return sorted(out, key=lambda c: (c["first_step"], c["end_step"], c["kind"], c["job_id"]))


def write_chunks(root: Path, view: RunView, codes: np.ndarray, label: np.ndarray, labels: list[str],
                 documents: dict[int, dict]) -> int:
    """data/steps/*.js: each step's record as logged, its status, the chain before it and (chosen steps) its
    documents; returns the number of files."""
    recs = view.log.records  # index i: step i - 1
    n = len(recs) - 1
    for k, a in enumerate(range(0, n, CHUNK)):
        steps = []
        for s in range(a, min(n, a + CHUNK)):
            item = {"step": s, "record": recs[s + 1], "prev_chain": recs[s]["chain_hash"], "status": int(codes[s]),
                    "label": labels[label[s]]}
            if s in documents:
                item["documents"] = documents[s]
            steps.append(item)
        write_data(root / "steps" / f"{k:06d}.js", f"chunk-{k}", {"first": a, "steps": steps})
    return -(-n // CHUNK)


def run_data(view: RunView, run: str, documents_steps: tuple[int, int], note: str) -> dict:
    return {"name": view.path.resolve().name, "n_steps": view.coverage.n_steps, "run_hash": view.log.run_hash,
            "verdict": view.coverage.verdict, "statuses": list(STATUS_NAMES), "chunk": CHUNK,
            "documents_steps": list(documents_steps), "documents_note": note,
            "inspect_command": f"python -m app data inspect --run {shlex.quote(run)} --step "}
