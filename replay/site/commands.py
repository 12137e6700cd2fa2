"""The command lines that reproduce a run and each of its audits, as the site prints them.

Derived from what the run directory records: the config (a preset plus the command line's overrides), the
topologies of its log, its checkpoint and evaluation spacing, and each certificate's segment, device and backend.
Options that do not change a bit of the log (checkpoint and eval spacing, threads) are given so that the run
directory comes out the same too.
"""
from __future__ import annotations

import shlex
from collections import Counter

from replay.sampling import Sample
from training.config import RunConfig, Topology
from training.errors import ConfigError
from training.presets import run_config

APP = "python -m app"


def _q(text: object) -> str:
    return shlex.quote(str(text))


def _spacing(steps: list[int]) -> int:
    """The most common gap between consecutive counts (from 0), 0 when there are none."""
    gaps = Counter(b - a for a, b in zip([0, *steps], steps) if b > a)
    return gaps.most_common(1)[0][0] if gaps else 0


def train_command(cfg: RunConfig, records: list[dict], checkpoints: list[int], eval_steps: list[int],
                  run: str) -> tuple[str | None, str]:
    """(`python -m app train ...` that writes this run's log, a note); None where no command line gives the config
    (it is not a preset with --micro-batch / --corpus overrides), the note saying which fields differ."""
    try:
        preset = run_config(cfg.name, cfg.train.micro_batch, cfg.train.corpus)
    except ConfigError:
        return None, f"config {cfg.name!r} is not a preset: train it from a program with this config.json"
    if preset != cfg:
        ours, theirs = cfg.to_dict(), preset.to_dict()
        diff = sorted(f"{g}.{k}" for g in ("model", "train") for k in ours[g] if ours[g][k] != theirs[g].get(k))
        return None, (f"config.json differs from preset {cfg.name!r} in {', '.join(diff) or 'its name'}: "
                      f"train it from a program with this config.json")
    parts = [APP, "train", "--config", _q(cfg.name), "--corpus", _q(cfg.train.corpus)]
    if cfg.train.micro_batch != run_config(cfg.name).train.micro_batch:
        parts += ["--micro-batch", str(cfg.train.micro_batch)]
    parts += ["--steps", str(len(records)), "--out", _q(run)]
    topologies = list(dict.fromkeys(r["topology"] for r in records))
    note = ""
    if len(topologies) > 1:
        worlds = [Topology.parse(t).world for t in topologies]
        shards = {Topology.parse(t).dp_shard for t in topologies}
        parts += ["--workers", f"{min(worlds)}:{max(worlds)}"]
        if shards != {1}:
            parts += ["--dp-shard", str(max(shards))]
        note = (f"trained on Ray Train workers whose topology changed ({' -> '.join(topologies)}); with exact "
                f"reduction the log does not depend on where the resizes happened")
    elif topologies and topologies[0] != "1x1":
        parts += ["--topology", topologies[0]]
    parts += ["--checkpoint-every", str(_spacing(checkpoints)), "--eval-every", str(_spacing(eval_steps))]
    return " ".join(parts), note


def job_commands(certs: list[dict], run: str, samples: dict[str, Sample] | None = None) -> list[dict]:
    """Per audit job: {job, command, segments, kinds} with the `audit batch` line that audits the same segments
    (a sampled job's: its population's steps, --sample and --seed; `samples` by certificate file name)."""
    jobs: dict[str, list[dict]] = {}
    for c in certs:
        jobs.setdefault(c["job_id"], []).append(c)
    out = []
    for job, cs in sorted(jobs.items()):
        sample = (samples or {}).get(cs[0].get("file", ""))
        spans = sample.population if sample else [(c["first_step"], c["end_step"]) for c in cs]
        a, b = min(x for x, _ in spans), max(y for _, y in spans)
        k = max(y - x for x, y in spans)
        cmd = [APP, "audit", "batch", "--run", _q(run), "--steps", f"{a}:{b}", "--segment", str(k)]
        if sample:
            cmd += ["--sample", str(sample.fraction), "--seed", str(sample.seed)]
        if any(str(c["device"]).startswith("cuda") for c in cs):
            cmd += ["--device", "cuda"]
        out.append({"job": job, "command": " ".join(cmd), "segments": len(cs),
                    "kinds": sorted({c["kind"] for c in cs}),
                    "verdicts": dict(sorted(Counter(c["verdict"] for c in cs).items()))})
    return out


def replay_command(cert: dict, run: str) -> str:
    """The `audit replay` line that replays one certificate's segment on one device, as its auditor did."""
    cmd = [APP, "audit", "replay", "--run", _q(run)]
    if cert["start_checkpoint"]:
        cmd += ["--from-checkpoint", str(cert["start_checkpoint"])]
    cmd += ["--until-step", str(cert["end_step"] - 1)]
    if str(cert["device"]).startswith("cuda"):
        cmd += ["--device", "cuda"]
    backend = str(cert.get("backend") or "").split(" ")[0]
    if backend and backend != "ref":
        cmd += ["--backend", _q(backend)]
    return " ".join(cmd)


def whole_run_commands(run: str, n_steps: int) -> list[str]:
    """Merge every job's certificates; replay every step on this machine."""
    return [f"{APP} audit coverage --run {_q(run)}",
            f"{APP} audit replay --run {_q(run)} --until-step {n_steps - 1}"]
