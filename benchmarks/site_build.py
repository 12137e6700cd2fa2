"""How long `audit site` takes on a long run: a synthesized run directory of 10^5 logged steps.

    .venv/bin/python benchmarks/site_build.py [--steps 100000] [--template RUN] [--reps 1]

The run: config.json, run.json and data/ copied from a real tiny run (`--template`, else one trained here for 2 steps
on the demo corpus, built into a temporary directory), a hash log of `--steps` records in the real format (the
template's init record, then records with every field of a step and real chain links; the numbers are made up),
held-out evaluations every 100 steps, a resize half way, a spike (5 skipped steps) every 10^4 steps, and
certificates as the batch audit files them: every 100-step segment MATCH on cpu_x86, one MISMATCH segment,
a tenth of the run MATCH on a second kind. No checkpoints. Times `python -m app audit site` on it (a fresh
process, imports included; the documents of the default steps 0..49 and the MISMATCH step from the demo corpus).
Target: < 30 s. Prints a table, writes benchmarks/results/site_build.json (or --out FILE).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import blake3

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SEGMENT = 100


def _h(text: str) -> str:
    return blake3.blake3(text.encode()).hexdigest()


def _line(record: dict) -> str:
    return json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n"  # training/rundir.py's format


def synthetic_records(init: dict, n_steps: int) -> list[dict]:
    """The init record, then `n_steps` step records with every field a tiny run logs and chained hashes."""
    out, prev = [init], bytes.fromhex(init["chain_hash"])
    for s in range(n_steps):
        state = _h(f"state/{s}")
        prev = blake3.blake3(prev + bytes.fromhex(state)).digest()
        skipped = s % 10_000 in range(5000, 5005)
        loss = 8.3 - 0.35 * math.log1p(s / 50) + 0.02 * math.sin(s)
        out.append({"step": s, "tokens": 128 * (s + 1), "windows": [2 * s, 2 * s + 2],
                    "topology": "1x1" if s < n_steps // 2 else "2x1", "accum": 1, "loss": loss, "ce": loss - 0.007,
                    "z": 69.5, "grad_norm": 6.0 if s % 10_000 == 5000 else 0.5 + 2 / (1 + s / 100),
                    "clip_coef": 1.0, "lr": 1e-3 * min(1.0, (s + 1) / 20), "skipped": skipped,
                    "spike_trigger": s % 10_000 == 5000, "state_hash": state, "chain_hash": prev.hex(),
                    "digests": {k: _h(f"{k}/{s}") for k in ("forward", "backward", "reduced", "clipped", "optimizer")}})
    return out


def synthesize(template: Path, out: Path, n_steps: int, mismatch_at: int | None = None) -> Path:
    """A run directory of `n_steps` steps beside its certificates (module doc); `mismatch_at`: the step of the one
    MISMATCH certificate (default: near 3/4 of the run)."""
    from replay.certificates import RunLog, write_certificates
    from training.rundir import CONFIG, DATA, HASHLOG, METRICS, RUN_JSON, read_jsonl

    out.mkdir(parents=True)
    for name in (CONFIG, RUN_JSON):
        shutil.copy2(template / name, out / name)
    shutil.copytree(template / DATA, out / DATA)
    init = read_jsonl(template / HASHLOG)[0]
    (out / HASHLOG).write_text("".join(_line(r) for r in synthetic_records(init, n_steps)))
    evals = [m for m in read_jsonl(template / METRICS) if m.get("event") == "eval"][:1]
    norms = evals[0]["weight_norms"] if evals else {}
    (out / METRICS).write_text("".join(_line({"event": "eval", "step": s, "tokens": 128 * s,
                                              "heldout_ce": 8.3 - 0.3 * math.log1p(s / 50),
                                              "weight_norms": {k: v * (1 + s / 1e6) for k, v in norms.items()}})
                                       for s in range(0, n_steps + 1, 100)))
    log = RunLog(out)
    bad = mismatch_at if mismatch_at is not None else (3 * n_steps // 4) // SEGMENT * SEGMENT + 37
    rows = []
    for a in range(0, n_steps, SEGMENT):
        b = min(n_steps, a + SEGMENT)
        k = bad if a <= bad < b else None
        for kind in ("cpu_x86",) + (("gpu_nvidia",) if a < n_steps // 10 else ()):
            rows.append({"job_id": f"job-{kind}", "run_hash": log.run_hash, "first_step": a, "end_step": b,
                         "start_checkpoint": 0, "log_digest": log.segment_digest(a, b),
                         "expected_chain": log.chain(b - 1),
                         "computed_chain": "" if k is not None else log.chain(b - 1),
                         "verdict": "MISMATCH" if k is not None else "MATCH", "mismatch_step": k,
                         "mismatch_stage": "clip" if k is not None else None,
                         "mismatch_detail": (f"step {k} (1x1), clipped digest: logged {_h('x')}, replay {_h('y')}"
                                             if k is not None else None),
                         "steps_replayed": b - a, "kind": kind, "kind_source": "detected",
                         "device": "cuda:0" if kind.startswith("gpu") else "cpu", "device_name": "synthetic",
                         "backend": "ref (torch 2.13.0+cpu)", "torch_version": "2.13.0+cpu",
                         "cpu_isa": "x86_64/AVX512", "hostname": "bench", "seconds": 1.0,
                         "time": "2026-12-07T00:00:00Z"})
    for kind in ("cpu_x86", "gpu_nvidia"):
        write_certificates(out, f"20261207T000000Z-{kind}", [r for r in rows if r["kind"] == kind])
    return out


def tiny_template(root: Path) -> Path:
    """A 2-step tiny run on the demo corpus, built under `root`."""
    import torch

    from stream import build_demo
    from training.presets import TINY
    from training.train import TrainOptions, train

    torch.set_num_threads(1)
    build_demo(root / "corpus", vocab_size=TINY.model.vocab_size, progress=False)
    cfg = TINY.replace(**{"train.corpus": str(root / "corpus")})
    train(cfg, root / "template", TrainOptions(steps=2, checkpoint_every=0, eval_every=1, progress=False))
    return root / "template"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--template", default=None, help="a tiny run directory to copy config.json, run.json, data/ from")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "site_build.json"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        template = Path(args.template) if args.template else tiny_template(tmp)
        t0 = time.perf_counter()
        run = synthesize(template, tmp / "run", args.steps)
        synth_s = time.perf_counter() - t0
        log_mb = (run / "hashlog.jsonl").stat().st_size / 2**20
        times = []
        for i in range(args.reps):
            out = tmp / f"site-{i}"
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "app", "audit", "site", "--run", str(run), "--out", str(out)],
                           cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            times.append(time.perf_counter() - t0)
        site_mb = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) / 2**20
        files = sum(1 for f in out.rglob("*") if f.is_file())
    res = {"steps": args.steps, "hashlog_mb": round(log_mb, 1), "synthesize_s": round(synth_s, 2),
           "site_s": [round(t, 2) for t in times], "site_mb": round(site_mb, 1), "site_files": files,
           "target_s": 30, "machine": f"{platform.machine()}, {os.cpu_count()} cores",
           "python": platform.python_version(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}
    print(f"{'steps':>8} {'hash log MB':>11} {'site s':>8} {'site MB':>8} {'files':>6}")
    print(f"{args.steps:>8} {log_mb:>11.1f} {min(times):>8.2f} {site_mb:>8.1f} {files:>6}   (target < 30 s)")
    out_file = Path(args.out)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
