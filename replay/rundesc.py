"""A run directory's self-description as the auditor checks it: run.json, its copies of the corpus manifest
and tokenizer in RUN/data/, and the collectives the run was recorded with.

Order of checks (before any step is replayed):
1. run.json parses; `collectives` is "exact" or "ordered" and `auditable` is not false (else refused:
   a run reduced by non-deterministic collectives has no replayable bits). Every hash-log record too.
2. The copies in RUN/data/ match the digests run.json lists (else refused, naming the file).
3. The corpus the auditor reads (`locate_corpus`): `--corpus DIR` if given, else the config's `train.corpus`
   (a relative path resolves against the working directory), else where run.json says the run read it (an
   absolute path: an audit job whose working copy has no data/ finds the corpus the run was trained from); the
   first whose manifest has the run's digest. A run's identity does not depend on that path: the state hash
   carries the corpus by its manifest digest. The tokenizer must be the run's too (same blake3); a difference
   is refused naming the file. Pointed at a copy on purpose (`--corpus DIR`, e.g. a re-hosted corpus), the
   differences are reported as notes and the replay goes on: the tokens are then checked by the step digests,
   and the stream state is hashed under the run's corpus identity, so every step the copy feeds unchanged can
   match.
The stream itself then verifies every shard of the corpus against that corpus's manifest (stream/).
"""
from __future__ import annotations

import json
from pathlib import Path

from replay.errors import AuditRefused
from stream.errors import StreamError
from stream.fileio import blake3_file, member
from stream.manifest import MANIFEST_NAME, load_manifest
from training.rundir import HASHLOG, RUN_JSON

REPLAYABLE = ("exact", "ordered")


def check_collectives(run: Path, desc: dict | None, records: list[dict]) -> None:
    """Refuse a run (or any step) recorded with non-deterministic collectives."""
    if desc is not None:
        mode = desc.get("collectives")
        if mode not in REPLAYABLE or desc.get("auditable") is False:
            raise AuditRefused(f"{run / RUN_JSON}: collectives {mode!r}, auditable {desc.get('auditable')!r}: the run "
                               f"was reduced by non-deterministic collectives; its steps cannot be replayed bitwise "
                               f"(replayable: {list(REPLAYABLE)})")
    for r in records:
        if r.get("collectives") == "native" or r.get("auditable") is False:
            raise AuditRefused(f"{run / HASHLOG}: step {r.get('step')} was recorded with collectives "
                               f"{r.get('collectives')!r} (auditable {r.get('auditable')!r}): non-deterministic, "
                               f"not replayable bitwise")


def check_copies(run: Path, desc: dict) -> None:
    """Every file run.json lists (RUN/data/ copies, config.json) has its recorded blake3."""
    for rel, want in sorted(desc.get("files", {}).items()):
        try:
            path = member(run, rel)  # a listed name never leads outside the run directory
        except ValueError as e:
            raise AuditRefused(f"{run / RUN_JSON}: files entry {e}") from None
        if not path.is_file():
            raise AuditRefused(f"{path}: listed in {run / RUN_JSON} but missing")
        got = blake3_file(path)
        if got != want:
            raise AuditRefused(f"{path}: blake3 {got}, {run / RUN_JSON} records {want}; the run directory was altered")


def find_corpus(run: Path, desc: dict | None, config_corpus: str, given: str | Path | None) -> Path:
    """The corpus directory to read (module doc, step 3): `locate_corpus`'s, else AuditRefused naming every place
    looked at and why it would not do."""
    if given is not None:  # a copy on purpose: check_corpus reports how it differs, the step digests check it
        return Path(given)
    path, why = locate_corpus(run, config_corpus, desc)
    if path is None:
        raise AuditRefused(f"corpus: {why}; to audit a copy anyway, pass --corpus DIR")
    return path


def check_corpus(run: Path, desc: dict | None, corpus: Path, explicit: bool) -> tuple[str | None, list[str]]:
    """(the run's manifest digest, notes): the corpus at `corpus` against the run's (module doc, step 3)."""
    if desc is None:
        return None, [f"{run / RUN_JSON} missing (a run older than self-description): the corpus is checked only "
                      f"through the state hashes, which name its manifest digest"]
    want = desc.get("corpus", {})
    try:
        m = load_manifest(corpus)
    except (StreamError, OSError) as e:  # each names the file
        raise AuditRefused(f"corpus {corpus}: {e}") from None
    notes = []
    if m.digest != want.get("manifest_blake3"):
        msg = (f"{corpus / MANIFEST_NAME}: corpus manifest digest {m.digest}, the run's ({run / 'data' / MANIFEST_NAME}) "
               f"is {want.get('manifest_blake3')}")
        if not explicit:
            raise AuditRefused(msg + "; this is not the run's corpus (to audit a copy anyway, pass --corpus DIR)")
        notes.append(msg + _manifest_diff(run / "data" / MANIFEST_NAME, corpus / MANIFEST_NAME))
    if m.tokenizer_blake3 != want.get("tokenizer_blake3"):
        msg = (f"{corpus / m.tokenizer_path}: tokenizer blake3 {m.tokenizer_blake3}, the run's is "
               f"{want.get('tokenizer_blake3')}")
        if not explicit:
            raise AuditRefused(msg)
        notes.append(msg)
    return want.get("manifest_blake3"), notes


def _manifest_diff(theirs: Path, ours: Path) -> str:
    """Which shards differ between two manifests (by path and blake3): a short clause for the note."""
    try:
        a, b = (json.loads(p.read_text()) for p in (theirs, ours))
    except (OSError, json.JSONDecodeError):
        return ""
    def shards(d):
        return {(s["name"], e["path"]): e["blake3"] for s in d.get("sources", []) for e in s.get("shards", [])}
    sa, sb = shards(a), shards(b)
    diff = [f"{src}/{path}" for (src, path) in sorted(set(sa) | set(sb)) if sa.get((src, path)) != sb.get((src, path))]
    return f" (shards differing: {', '.join(diff[:5])}{' ...' if len(diff) > 5 else ''})" if diff else ""


def locate_corpus(run: Path, config_corpus: str, desc: dict | None,
                  given: str | Path | None = None) -> tuple[Path | None, str]:
    """(the run's corpus directory, "") or (None, why not): `given` if any, else the config's `train.corpus`, else the
    path run.json recorded; the first whose manifest loads and, where run.json names one, has the run's digest.
    For readers that can do without the corpus (the audit site's step view), so nothing here raises."""
    want = (desc or {}).get("corpus", {}).get("manifest_blake3")
    tried = []
    paths = [given] if given is not None else [config_corpus, (desc or {}).get("corpus", {}).get("path")]
    for p in dict.fromkeys(Path(x) for x in paths if x):
        try:
            m = load_manifest(p)
        except (StreamError, OSError) as e:
            tried.append(str(e))
            continue
        if want is not None and m.digest != want:
            tried.append(f"{p / MANIFEST_NAME}: manifest digest {m.digest}, the run's ({run / RUN_JSON}) is {want}: "
                         f"not the run's corpus")
            continue
        return p, ""
    return None, "; ".join(tried) or f"{run / RUN_JSON}: names no corpus"
