"""A run directory and its certificates, read once for the site: the log, config, self-description, coverage and
held-out evaluations. Nothing here writes."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replay.certificates import RunLog
from replay.coverage import Coverage, coverage_of
from replay.errors import AuditRefused
from training import rundir
from training.config import RunConfig, Topology
from training.errors import ConfigError

FIELDS = ("tokens", "windows", "topology", "loss", "state_hash", "chain_hash")  # what every step record must hold


@dataclass
class RunView:
    path: Path  # the run directory as given on the command line (commands quote it as given)
    log: RunLog
    cfg: RunConfig
    desc: dict | None  # run.json (None: a run older than self-description)
    coverage: Coverage
    evals: list[dict]  # metrics.jsonl's eval events
    checkpoints: list[int]

    @property
    def records(self) -> list[dict]:
        """The step records 0..N-1 (the init record left out)."""
        return self.log.records[1:]

    @property
    def init(self) -> dict:
        return self.log.records[0]


def read_run(path: str | Path) -> RunView:
    """Read `path` as a run directory with its certificates; AuditRefused / RunDirError / CertificateError name the
    file that is missing or malformed."""
    path = Path(path)
    if not (path / rundir.CONFIG).is_file() or not (path / rundir.HASHLOG).is_file():
        raise AuditRefused(f"{path}: not a run directory (needs {rundir.CONFIG} and {rundir.HASHLOG})")
    log = RunLog(path)
    check_records(path, log.records[1:])
    cfg, _ = rundir.read_config(path)
    desc = rundir.read_run_json(path)
    evals = [r for r in rundir.read_jsonl(path / rundir.METRICS) if r.get("event") == "eval"]
    return RunView(path, log, cfg, desc, coverage_of(log), evals, rundir.list_checkpoints(path))


def check_records(run: Path, records: list[dict]) -> None:
    """Every step record holds the fields the site shows, and a topology `RxS`; AuditRefused names the step."""
    for r in records:
        missing = [f for f in FIELDS if f not in r]
        if missing:
            raise AuditRefused(f"{run / rundir.HASHLOG}: the record of step {r['step']} lacks {missing}; not a hash "
                               f"log this project wrote (or an edited one)")
    for t in {r["topology"] for r in records}:
        try:
            Topology.parse(str(t))
        except ConfigError as e:
            raise AuditRefused(f"{run / rundir.HASHLOG}: {e}") from None
