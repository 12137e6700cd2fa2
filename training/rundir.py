"""The run directory: its layout, how it is created, written and read back, and the agreement between its hash log
and its checkpoints. The trainers and the replay both go through here.

    RUN/config.json      canonical JSON of the run's config, written once at the start
    RUN/run.json         what an auditor checks before replaying: the collectives, code version, config digest,
                         corpus identity, and the blake3 of every file it lists (config.json, the data/ copies)
    RUN/data/            copies of the corpus manifest and tokenizer
    RUN/hashlog.jsonl    one record per step, the init record (step -1) first; only values that are functions of
                         (config, corpus, code): two runs of the same steps on any machine write the same bytes
    RUN/metrics.jsonl    timings, held-out CE, weight norms, events: the machine's facts
    RUN/checkpoints/step-<12 digits>/   pickle-free checkpoints (training/checkpoint.py)
    RUN/hashlog.before-resume-<n>.jsonl the log as it was when a resume recomputed steps logged after its checkpoint
    RUN/loss.png
Whole files are written atomically (stream/fileio.py); the logs are appended a line at a time, each fsynced.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import blake3

from stream.fileio import atomic_directory, atomic_write_bytes, atomic_write_json, blake3_file
from training.config import RunConfig, from_dict
from training.errors import ConfigError, RunDirError
from training.state_hash import canonical_json

CONFIG, RUN_JSON, HASHLOG, METRICS = "config.json", "run.json", "hashlog.jsonl", "metrics.jsonl"
CHECKPOINTS, DATA, LOSS_PLOT = "checkpoints", "data", "loss.png"
FORMAT = "run/1"


# -- layout ----------------------------------------------------------------------------------------------------
def ckpt_dir(run: str | Path, step: int) -> Path:
    """The checkpoint of the state after `step` steps."""
    return Path(run) / CHECKPOINTS / f"step-{step:012d}"


def list_checkpoints(run: str | Path) -> list[int]:
    """Completed checkpoints of a run (their step counts), ascending; temporary directories are ignored."""
    root = Path(run) / CHECKPOINTS
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir()
                  if p.is_dir() and p.name.startswith("step-") and p.name[5:].isdigit())


# -- the logs --------------------------------------------------------------------------------------------------
def _line(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"


class JsonlLog:
    """Append records to `path`, each followed by flush + fsync (a crash loses at most the line in flight)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._fh.write(_line(record))
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonlLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: str | Path) -> list[dict]:
    """All complete records of a log (a torn last line, from a crash mid-write, is dropped)."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_bytes().split(b"\n")
    out = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if i == len(lines) - 1:  # no newline after it: the write never finished
                break
            raise RunDirError(f"{path}: line {i + 1} is not JSON; the log is damaged (use an intact copy of the "
                              f"run directory)") from None
    return out


def rewrite_jsonl(path: str | Path, records: list[dict]) -> None:
    """Replace the log with `records`, atomically."""
    atomic_write_bytes(path, "".join(_line(r) for r in records).encode("utf-8"))


# -- creating and reading a run --------------------------------------------------------------------------------
def create(run: Path, config_json: str) -> None:
    """A new run directory holding its config; refuses an existing path (a run is never overwritten)."""
    if run.exists():
        raise RunDirError(f"{run}: exists; refusing to overwrite a run (pass --resume to continue it, or choose "
                          f"another --out)")
    with atomic_directory(run) as tmp:  # the directory appears with its config or not at all
        (tmp / CONFIG).write_bytes((config_json + "\n").encode())


def read_config(run: Path) -> tuple[RunConfig, str]:
    """(config, its canonical JSON) of a run; refuses a config.json that is not the canonical JSON it was written as."""
    path = run / CONFIG
    if not path.is_file():
        raise RunDirError(f"{run}: not a run directory ({CONFIG} missing)")
    text = path.read_text().strip()
    try:
        cfg = from_dict(json.loads(text))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path}: not valid JSON ({e})") from None
    config_json = canonical_json(cfg.to_dict()).decode()
    if config_json != text:
        raise RunDirError(f"{path}: not the canonical JSON of a config (edited?)")
    return cfg, config_json


def check_resumable(run: Path, cfg: RunConfig) -> None:
    """A run to resume exists and was started with `cfg`, up to where its corpus lies (the stream checks that the
    corpus is the run's by its manifest digest)."""
    if not (run / CONFIG).is_file():
        raise RunDirError(f"{run}: --resume needs an existing run directory with {CONFIG}")
    saved, _ = read_config(run)
    if saved.identity_json() != cfg.identity_json():
        raise ConfigError(f"{run / CONFIG}: the run was started with another config; resume with it")


def write_run_json(run: Path, config_json: str, code: str, manifest, collectives: str) -> Path:
    """RUN/run.json plus the RUN/data/ copies of the corpus manifest and tokenizer, each with its blake3.
    `collectives`: "exact" / "ordered" (replayable) or "native" (non-deterministic: the replay refuses the run)."""
    files = {}
    copies = (("manifest.json", manifest.root / "manifest.json"), (manifest.tokenizer_path, manifest.tokenizer_file))
    for rel, src in copies:
        dst = run / DATA / rel  # the manifest refused a tokenizer path outside the corpus, so this stays in RUN/data
        atomic_write_bytes(dst, src.read_bytes())
        files[f"{DATA}/{rel}"] = blake3_file(dst)
    files[CONFIG] = blake3_file(run / CONFIG)
    desc = {"format": FORMAT, "collectives": collectives, "auditable": collectives != "native",
            "code_version": code, "config_blake3": blake3.blake3(config_json.encode()).hexdigest(),
            "corpus": {"path": str(Path(manifest.root).resolve()), "manifest_blake3": manifest.digest,
                       "tokenizer_path": manifest.tokenizer_path, "tokenizer_blake3": manifest.tokenizer_blake3},
            "files": files}
    atomic_write_json(run / RUN_JSON, desc)
    return run / RUN_JSON


def read_run_json(run: Path) -> dict | None:
    """run.json of `run` (None for a run recorded before run directories described themselves)."""
    path = run / RUN_JSON
    if not path.is_file():
        return None
    try:
        desc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunDirError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(desc, dict):
        raise RunDirError(f"{path}: expected a JSON object")
    return desc


# -- the log and the checkpoints -------------------------------------------------------------------------------
def disagreement(records: dict[int, dict], step: int, manifest: dict) -> str | None:
    """The first of (state_hash, chain_hash) in which the checkpoint of the state after `step` steps differs from
    the log's record of step `step - 1` (None: they agree, so the log continues from that checkpoint)."""
    rec = records.get(step - 1, {})
    for key in ("state_hash", "chain_hash"):
        if manifest.get(key) != rec.get(key):
            return key
    return None


def cut_log_at(run: Path, step: int) -> dict[int, dict]:
    """Truncate the hash log to the records before `step` (a resume from the checkpoint at `step`); the records
    from `step` on are returned, to be re-checked as they are recomputed, and the whole log as it was is kept as
    hashlog.before-resume-<n>.jsonl."""
    records = read_jsonl(run / HASHLOG)
    later = {r["step"]: r for r in records if r["step"] >= step}
    if later:
        n = 1
        while (run / f"hashlog.before-resume-{n}.jsonl").exists():
            n += 1
        rewrite_jsonl(run / f"hashlog.before-resume-{n}.jsonl", records)
    rewrite_jsonl(run / HASHLOG, [r for r in records if r["step"] < step])
    return later
