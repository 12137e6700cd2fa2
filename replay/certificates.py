"""Audit certificates: one parquet row per audited segment, one file per audit job.

A certificate says: on this machine (kind, device, backend, torch, CPU ISA, host), replaying steps
[first_step, end_step) of the run whose log ends in `run_hash` gave `verdict`. `log_digest` is blake3 over the
hash-log lines of steps first_step-1 .. end_step-1 as stored: the exact bytes the certificate vouches for, so a
log edited after the audit makes the certificate stale (ignored, with a warning) instead of silently reused.
Files live in RUN/audit/certificates/<job-id>.parquet, written to a temporary name and renamed (atomic).
A sampled job's file also records its sample (replay/sampling.py) in the parquet metadata under SAMPLE_KEY: the
population of segments, the fraction, the seed and the drawn segments. A file without it is a full or explicit audit.
"""
from __future__ import annotations

from pathlib import Path

import blake3
import pyarrow as pa
import pyarrow.parquet as pq

from stream.fileio import atomic_path
from training.errors import AppError
from training.rundir import read_jsonl
from replay.sampling import Sample, reproduces

CERT_DIR = Path("audit") / "certificates"
HASHLOG = "hashlog.jsonl"

SCHEMA = pa.schema([
    ("job_id", pa.string()),
    ("run_hash", pa.string()),
    ("first_step", pa.int64()),
    ("end_step", pa.int64()),
    ("start_checkpoint", pa.int64()),  # the replay's starting state: the latest checkpoint <= first_step (0: init)
    ("log_digest", pa.string()),
    ("expected_chain", pa.string()),
    ("computed_chain", pa.string()),
    ("verdict", pa.string()),  # MATCH | MISMATCH | REFUSED (input refused: nothing certified)
    ("mismatch_step", pa.int64()),
    ("mismatch_stage", pa.string()),
    ("mismatch_detail", pa.string()),
    ("steps_replayed", pa.int64()),
    ("kind", pa.string()),  # hardware kind: cpu_x86 | cpu_arm | gpu_nvidia | cpu_<machine>
    ("kind_source", pa.string()),  # "detected", or "override" (a simulated kind: tests only)
    ("device", pa.string()),
    ("device_name", pa.string()),
    ("backend", pa.string()),
    ("torch_version", pa.string()),
    ("cpu_isa", pa.string()),  # platform.machine() / torch.backends.cpu.get_cpu_capability()
    ("hostname", pa.string()),
    ("seconds", pa.float64()),
    ("time", pa.string()),  # UTC, ISO 8601, when the segment finished
])
VERDICTS = ("MATCH", "MISMATCH", "REFUSED")
SAMPLE_KEY = b"audit_sample"  # parquet metadata: the job's Sample as JSON (absent: not sampled)


class CertificateError(AppError):
    """A certificate file is unreadable or does not have the certificate schema: names the file."""


class RunLog:
    """A run's hash log as the audit sees it: step records 0..N-1, their raw lines and the run hash."""

    def __init__(self, run: str | Path) -> None:
        self.run = Path(run)
        path = self.run / HASHLOG
        if not path.is_file():
            raise CertificateError(f"{path}: no hash log; is {self.run} a run directory?")
        records = read_jsonl(path)
        lines = [ln for ln in path.read_bytes().split(b"\n") if ln][:len(records)]  # a torn last line is dropped
        steps = [r.get("step") for r in records]
        if not records or steps != list(range(-1, len(records) - 1)):
            raise CertificateError(f"{path}: expected records for steps -1, 0, 1, ... in order; got {steps[:8]}...")
        self.lines = lines  # lines[i] is the record of step i - 1
        self.records = records
        self.n_steps = len(records) - 1
        self.run_hash = records[-1]["chain_hash"]  # the chain hash after the last logged step: the run's identity
        self._step_of_chain = {r.get("chain_hash"): r["step"] for r in records}

    def extends(self, run_hash: str, end: int) -> bool:
        """Whether the log a certificate of steps ..end-1 was written against (its run hash, the chain hash after
        its last step) is this log or a prefix of it reaching step end-1: a run audited while it trained."""
        return self._step_of_chain.get(run_hash, -2) >= end - 1

    def chain(self, step: int) -> str:
        """The logged chain hash after `step` (step -1: the init record)."""
        return self.records[step + 1]["chain_hash"]

    def segment_digest(self, first: int, end: int) -> str:
        """blake3 over the stored lines of steps first-1 .. end-1 (the link into the segment and the segment)."""
        h = blake3.blake3()
        for ln in self.lines[first:end + 1]:
            h.update(ln + b"\n")
        return h.hexdigest()


def cert_path(run: str | Path, job_id: str) -> Path:
    return Path(run) / CERT_DIR / f"{job_id}.parquet"


def write_certificates(run: str | Path, job_id: str, rows: list[dict], sample: Sample | None = None) -> Path:
    """Write a job's certificates (and the sample it drew them by) atomically; refuses to overwrite a job's file."""
    path = cert_path(run, job_id)
    if path.exists():
        raise CertificateError(f"{path}: exists; a job id is used once")
    schema = SCHEMA.with_metadata({SAMPLE_KEY: sample.to_json()}) if sample is not None else SCHEMA
    table = pa.Table.from_pylist(rows, schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return path


def read_certificates(path: str | Path) -> list[dict]:
    """The rows of one certificate file; CertificateError naming it if corrupt or of another schema."""
    path = Path(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise CertificateError(f"{path}: not a readable parquet file ({e})") from None
    missing = [f.name for f in SCHEMA if f.name not in table.column_names]
    if missing:
        raise CertificateError(f"{path}: not a certificate file; missing columns {missing}")
    rows = table.select(SCHEMA.names).to_pylist()
    bad = sorted({r["verdict"] for r in rows} - set(VERDICTS), key=str)
    if bad:
        raise CertificateError(f"{path}: unknown verdict(s) {bad}; expected one of {list(VERDICTS)}")
    return rows


def read_sample(path: str | Path) -> Sample | None:
    """The sample a job's file records; None for a full or explicit audit. CertificateError names a malformed one."""
    path = Path(path)
    try:
        text = (pq.read_schema(path).metadata or {}).get(SAMPLE_KEY)
        return None if text is None else Sample.from_json(text)
    except (pa.ArrowException, OSError) as e:
        raise CertificateError(f"{path}: not a readable parquet file ({e})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CertificateError(f"{path}: its recorded sample is malformed ({e})") from None


def certificate_files(run: str | Path) -> list[Path]:
    """Every job's certificate file of a run, by name (job ids start with their UTC time)."""
    root = Path(run) / CERT_DIR
    return sorted(p for p in root.glob("*.parquet") if not p.name.startswith(".")) if root.is_dir() else []


def load_valid(log: RunLog, files: list[Path] | None = None) -> tuple[list[dict], list[str]]:
    """(certificates that vouch for this log, warnings naming each file whose rows were ignored and why)."""
    files = certificate_files(log.run) if files is None else files
    rows, warnings = [], []
    for path in files:
        other_run = stale = 0
        for r in read_certificates(path):
            if not log.extends(r["run_hash"], r["end_step"]):
                other_run += 1
            elif r["end_step"] > log.n_steps or r["log_digest"] != log.segment_digest(r["first_step"], r["end_step"]):
                stale += 1
            else:
                rows.append({**r, "file": path.name})
        if other_run:
            warnings.append(f"{path}: {other_run} certificate(s) for run hash {_other_hash(path)[:16]}..., "
                            f"not this run's {log.run_hash[:16]}...; ignored")
        if stale:
            warnings.append(f"{path}: {stale} certificate(s) vouch for hash-log lines that differ from "
                            f"{log.run / HASHLOG} now (edited after the audit?); ignored")
    return rows, warnings


def load_samples(log: RunLog, certs: list[dict]) -> tuple[dict[str, Sample], list[str]]:
    """(the sample of each file some of `certs` come from, by file name; warnings naming each sample left out).

    A sample whose drawn segments are not what its population, fraction and seed draw for this run was not drawn by
    replay.sampling (hand-picked, or another run's): it says nothing about the odds, and is left out."""
    samples, warnings = {}, []
    for name in sorted({c["file"] for c in certs}):
        sample = read_sample(log.run / CERT_DIR / name)
        if sample is None:
            continue
        if reproduces(sample, log.run_hash):
            samples[name] = sample
        else:
            warnings.append(f"{log.run / CERT_DIR / name}: its drawn segments are not the draw of seed {sample.seed} "
                            f"from its {len(sample.population)} segments; no sample statement")
    return samples, warnings


def _other_hash(path: Path) -> str:
    hashes = pq.read_table(path, columns=["run_hash"]).column("run_hash").to_pylist()
    return hashes[0] if hashes else "?"
