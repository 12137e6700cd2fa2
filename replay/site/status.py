"""Each step's audit status as the site shows it, from the merged coverage (replay/coverage.py).

MISMATCH where any kind diverged at the step, else MATCH where some kind certified it, else REFUSED where only
refused segments cover it, else not audited. Labels name the kinds ("MATCH on cpu_arm*, cpu_x86"); computed over
arrays, so 10^5 steps cost milliseconds.
"""
from __future__ import annotations

import re

import numpy as np

from replay.coverage import MATCH, MISMATCH, Coverage

NOT_AUDITED, MATCHED, MISMATCHED, REFUSED = 0, 1, 2, 3
STATUS_NAMES = ("not audited", "MATCH", "MISMATCH", "REFUSED")


def step_status(cov: Coverage) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(status code per step, label index per step, labels)."""
    n = cov.n_steps
    kinds = list(cov.status)
    match = np.stack([cov.status[k] == MATCH for k in kinds] or [np.zeros(n, dtype=bool)], axis=1)
    mism = np.stack([cov.status[k] == MISMATCH for k in kinds] or [np.zeros(n, dtype=bool)], axis=1)
    refused = np.zeros(n, dtype=bool)
    for c in cov.refused():
        refused[c["first_step"]:c["end_step"]] = True
    code = np.where(mism.any(axis=1), MISMATCHED,
                    np.where(match.any(axis=1), MATCHED, np.where(refused, REFUSED, NOT_AUDITED))).astype(np.int8)
    key = np.concatenate([code[:, None], mism, match], axis=1).astype(np.int8)
    uniq, index = np.unique(key, axis=0, return_inverse=True)
    k = len(kinds)
    labels = [_label(int(u[0]), [kinds[i] for i in np.flatnonzero(u[1:k + 1])],
                     [kinds[i] for i in np.flatnonzero(u[k + 1:])], cov) for u in uniq]
    return code, index.reshape(-1).astype(np.int32), labels


def _label(code: int, mism: list[str], match: list[str], cov: Coverage) -> str:
    on = lambda kinds: ", ".join(cov.kind_label(k) for k in kinds)  # noqa: E731
    if code == MISMATCHED:
        return f"MISMATCH on {on(mism)}" + (f" (MATCH on {on(match)})" if match else "")
    if code == MATCHED:
        return f"MATCH on {on(match)}"
    return STATUS_NAMES[code]


# `replay.diff.first_difference`'s sentence, as `replay.core` appends it to a mismatch's detail
_ELEMENT = re.compile(r"(?P<tensor>(?:param|grad|m|v)/[^\s\[]+)(?P<index>\[[^\]]*\]): expected (?P<expected>.+?), "
                      r"replay (?P<replay>.+?); (?P<count>\d+) of (?P<total>\d+) elements differ")


def mismatch_parts(detail: str | None) -> dict | None:
    """The tensor and first differing element a mismatch's detail names (None where it names none: the stage
    compares digests only, or the run kept no checkpoint after the step)."""
    m = _ELEMENT.search(detail or "")
    if m is None:
        return None
    return {"tensor": m["tensor"], "element": m["tensor"] + m["index"], "expected": m["expected"],
            "replay": m["replay"], "differing": f"{m['count']} of {m['total']}"}
