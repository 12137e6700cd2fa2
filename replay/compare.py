"""Two hash logs of the same run, compared as an auditor reads them: `python -m app audit compare A B`.

Verdicts (exit status):
- IDENTICAL (0): the files are byte-identical (the bitwise contract's own test).
- SAME BITS (0): every record is equal but for `topology`, the mesh a step's windows were cut over. A window's
  gradient and its place in the exact sum do not depend on the cut, so the state and chain hashes are equal
  too: the same run resized, or replayed on another mesh.
- SAME TRAJECTORY (3): every record holds the same fields and values but for `code_version` and the state and
  chain hashes (and `topology`), and the code versions differ. The state hash covers the code version, so any edit to a file
  the code version covers changes every state and chain hash while the training bits stay what they were.
  Each log's chain is checked (chain_t = blake3(chain_{t-1} | state_t)), so its state hashes are the ones
  chained. What the verdict does not cover: the state hash's meta entries beyond the code version (config,
  stream state) are not in the log on their own; the tensors are, through the stage digests when the run
  wrote them (the verdict says when it did not).
- DIFFERENT (1): the first record that differs otherwise, its step, the first stage digest and the fields.
A log longer than the other is compared over the common steps, and the verdict says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from training.rundir import HASHLOG, read_jsonl
from training.state_hash import ZERO, chain
from replay.errors import AuditRefused

CODE_BOUND = ("code_version", "state_hash", "chain_hash")  # the fields a code version change alters
CUT = ("topology",)  # how a step's windows were cut over ranks: a label, not an input of the step's bits
STAGES = ("forward", "backward", "reduced", "clipped", "optimizer")


@dataclass
class Comparison:
    verdict: str  # IDENTICAL, SAME TRAJECTORY or DIFFERENT
    detail: str
    common: int  # records compared (the init record included)
    lengths: tuple[int, int]

    @property
    def exit_code(self) -> int:
        return {"IDENTICAL": 0, "SAME BITS": 0, "SAME TRAJECTORY": 3}.get(self.verdict, 1)


def log_path(where: str | Path) -> Path:
    """A run directory's hash log, or the file itself."""
    p = Path(where)
    p = p / HASHLOG if p.is_dir() else p
    if not p.is_file():
        raise AuditRefused(f"{where}: no hash log (expected a run directory holding {HASHLOG}, or the file)")
    return p


def _records(path: Path) -> list[dict]:
    records = read_jsonl(path)
    steps = [r.get("step") if isinstance(r, dict) else None for r in records]
    if not records or steps != list(range(-1, len(records) - 1)):
        raise AuditRefused(f"{path}: expected records for steps -1, 0, 1, ... in order; got {steps[:8]}")
    return records


def broken_link(records: list[dict]) -> int | None:
    """The first step whose chain hash is not blake3(previous chain | its state hash), or None."""
    prev = ZERO
    for r in records:
        try:
            prev, logged = chain(prev, bytes.fromhex(r["state_hash"])), bytes.fromhex(r["chain_hash"])
        except (KeyError, TypeError, ValueError):  # chain refuses a state hash that is not 32 bytes
            return r["step"]
        if prev != logged:
            return r["step"]
    return None


def _first_difference(a: dict, b: dict, skip: tuple[str, ...]) -> str | None:
    keys = sorted(k for k in set(a) | set(b) if k not in skip and a.get(k) != b.get(k))
    if not keys:
        return None
    da, db = a.get("digests") or {}, b.get("digests") or {}
    stage = next((s for s in STAGES if da.get(s) != db.get(s)), None)
    where = f"; first differing stage digest {stage!r}" if stage else ""
    return f"step {a['step']}: fields {keys}{where}"


def _without_cut(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in CUT}


def _cuts(records: list[dict]) -> str:
    """The topologies of a log's steps in order of first use, e.g. '3x1 from step 0, 2x1 from step 100'."""
    first: dict = {}
    for r in records[1:]:
        first.setdefault(r.get("topology"), r["step"])
    return ", ".join(f"{t} from step {s}" for t, s in first.items())


def compare_logs(a_where: str | Path, b_where: str | Path) -> Comparison:
    """The verdict on hash logs A and B (run directories or files); refuses unreadable or unordered logs."""
    pa, pb = log_path(a_where), log_path(b_where)
    a, b = _records(pa), _records(pb)
    n = min(len(a), len(b))
    lengths = (len(a), len(b))
    tail = "" if len(a) == len(b) else f" (over the {n - 1} common steps; the logs hold {len(a) - 1} and {len(b) - 1})"
    if len(a) == len(b) and pa.read_bytes() == pb.read_bytes():
        return Comparison("IDENTICAL", f"{len(a) - 1} steps, byte-identical; run hash {a[-1]['chain_hash']}", n,
                          lengths)
    for name, recs in ((pa, a), (pb, b)):
        step = broken_link(recs)
        if step is not None:
            raise AuditRefused(f"{name}: the hash chain breaks at step {step} (chain_hash is not blake3 of the "
                               f"previous chain and this state_hash)")
    for x, y in zip(a[:n], b[:n]):
        other = _first_difference(x, y, CODE_BOUND + CUT)
        if other is not None:
            return Comparison("DIFFERENT", other, n, lengths)
    if a[:n] == b[:n]:
        return Comparison("IDENTICAL", f"the records are identical{tail}; run hash {a[n - 1]['chain_hash']}", n,
                          lengths)
    cuts = f"({_cuts(a[:n])} vs {_cuts(b[:n])})"
    recut = "" if [r.get("topology") for r in a[:n]] == [r.get("topology") for r in b[:n]] else \
        f"; the steps were cut differently {cuts}"
    if [_without_cut(r) for r in a[:n]] == [_without_cut(r) for r in b[:n]]:
        return Comparison("SAME BITS", f"every record equal but its topology {cuts}{tail}: the same state and chain "
                                       f"hashes; run hash {a[n - 1]['chain_hash']}", n, lengths)
    code_a, code_b = a[0].get("code_version", ""), b[0].get("code_version", "")
    if code_a == code_b:
        step = next(x["step"] for x, y in zip(a[:n], b[:n]) if x != y)
        return Comparison("DIFFERENT", f"step {step}: the state hashes differ under one code version ({code_a[:12]}): "
                                       f"the config or the stream state differ, which the log does not show", n,
                          lengths)
    digests = all(r.get("digests") for r in a[1:n])
    cover = ("every logged number and stage digest (params, m, v, gradients)" if digests else
             "every logged number (no stage digests: the tensors themselves are not compared)")
    return Comparison("SAME TRAJECTORY", f"{cover} equal over {n - 1} steps{tail}; the code versions differ "
                                         f"({code_a[:12]} vs {code_b[:12]}), and with them every state and chain "
                                         f"hash; both chains check{recut}", n, lengths)


def compare_main(a: str, b: str) -> int:
    """`python -m app audit compare`: prints the verdict; 0 IDENTICAL or SAME BITS, 3 SAME TRAJECTORY, 1 DIFFERENT."""
    c = compare_logs(a, b)
    print(f"{c.verdict}: {c.detail}")
    return c.exit_code
