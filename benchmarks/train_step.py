"""Training-step throughput on CPU: the reference (BR) backend vs stock PyTorch float32, side by side.

    .venv/bin/python benchmarks/train_step.py [--configs tiny small] [--steps 3] [--corpus data/demo] [--threads N]

Per config: one step = one microbatch of the preset's micro_batch windows (the same tokens for both arms).
The reference arm is training.step.run_step (forward, backward, exact reduction, clip, spike check, AdamW,
stage digests) and then the state hash; the stock arm is the same shapes in plain float32 PyTorch
(benchmarks/stock_model.py: nn.Linear, SDPA, torch AdamW, clip_grad_norm_). Prints a table and writes
benchmarks/results/train_step.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import stream  # noqa: E402
from training.config import Topology  # noqa: E402
from training.init import init_params  # noqa: E402
from training.params import count_params  # noqa: E402
from training.presets import preset  # noqa: E402
from training.state_hash import canonical_json, code_version, state_entries, state_hash  # noqa: E402
from training.step import StepContext, TrainState, run_step  # noqa: E402
from benchmarks.stock_model import StockModel  # noqa: E402


def _tokens(cfg, n: int) -> torch.Tensor:
    s = stream.open_stream(cfg.train.corpus, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
    return torch.from_numpy(s.windows(0, n)).to(torch.int64)


def bench_ref(cfg, steps: int) -> dict:
    mb = cfg.train.micro_batch
    cfg = cfg.replace(**{"train.batch_phases": ((1 << 50, mb),), "train.heldout_windows": 0})
    ctx = StepContext.build(cfg)
    st = TrainState.fresh(init_params(cfg.model, cfg.train.seed))
    code, cj = code_version(), canonical_json(cfg.to_dict()).decode()
    toks = _tokens(cfg, mb * (steps + 1))
    step_s, hash_s = [], []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        r = run_step(st, toks[i * mb:(i + 1) * mb], Topology(), ctx)
        t1 = time.perf_counter()
        state_hash(state_entries(st, cj, code, {"window": i}), r.memo)
        t2 = time.perf_counter()
        if i:  # the first step warms caches and allocators
            step_s.append(t1 - t0)
            hash_s.append(t2 - t1)
    return {"step_s": statistics.median(step_s), "hash_s": statistics.median(hash_s)}


def bench_stock(cfg, steps: int) -> dict:
    mb = cfg.train.micro_batch
    torch.manual_seed(0)  # the baseline's init is irrelevant to its speed
    model = StockModel(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr_peak, betas=(cfg.train.beta1, cfg.train.beta2),
                            eps=cfg.train.eps, weight_decay=cfg.train.weight_decay)
    toks = _tokens(cfg, mb * (steps + 1))
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        loss = model(toks[i * mb:(i + 1) * mb], cfg.train.z_loss)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:
            times.append(time.perf_counter() - t0)
    return {"step_s": statistics.median(times)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per arm (after one warm-up step)")
    ap.add_argument("--corpus", default="data/demo")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_step.json"))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads for both arms (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not (Path(args.corpus) / "manifest.json").is_file():
        stream.build_demo(args.corpus, progress=False)
    rows = []
    for name in args.configs:
        cfg = preset(name).replace(**{"train.corpus": args.corpus})
        tokens = cfg.train.micro_batch * cfg.model.seq_len
        ref, stock = bench_ref(cfg, args.steps), bench_stock(cfg, args.steps)
        row = {"config": name, "params": count_params(cfg.model)[0], "tokens_per_step": tokens,
               "ref_tok_s": tokens / ref["step_s"], "ref_hashed_tok_s": tokens / (ref["step_s"] + ref["hash_s"]),
               "hash_share": ref["hash_s"] / (ref["step_s"] + ref["hash_s"]), "stock_tok_s": tokens / stock["step_s"]}
        row["stock_over_ref"] = row["stock_tok_s"] / row["ref_tok_s"]
        rows.append(row)
        print(f"{name}: {row}", flush=True)
    print(f"\n| config | params | tokens/step | ref tok/s | ref + state hash tok/s | hash share | stock fp32 tok/s "
          f"| stock / ref |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['config']} | {r['params'] / 1e6:.1f}M | {r['tokens_per_step']} | {r['ref_tok_s']:,.0f} | "
              f"{r['ref_hashed_tok_s']:,.0f} | {100 * r['hash_share']:.1f}% | {r['stock_tok_s']:,.0f} | "
              f"{r['stock_over_ref']:.1f}x |")
    meta = {"command": "benchmarks/train_step.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": platform.processor()
            or platform.machine(), "cpus": torch.get_num_threads(), "torch": torch.__version__, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(meta, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
