"""ARVQ initial fit: seconds per expert at GLM-5.3 projection sizes, and the quality tables.

    python3 benchmarks/arvq_fit.py [--device cpu|cuda] [--quick] [--rows-w13 R] [--rows-w2 R] [--threads T]
                                   [--beam B] [--out benchmarks/results/arvq_fit.json]

Timing: one expert of w13 (N 4096 x K 6144) and w2 (N 6144 x K 2048) with synthetic Hessians
H = B B^T / r + diag(d) (rank r = 256, d log-normal, 8 heavy columns at 400x) and Gaussian weights,
default FitConfig (131,072 EM groups, 10 + 8 EM steps, FP4 in 4 stages, 1 pass, beam 8, ldl metric; --beam B
sets the beam of the EM and the sweep). The full N is fitted by default (on
CUDA after one small untimed warm-up fit). With --quick on CPU, or --rows-*, only the first R rows are
fitted and the full size is estimated as cholesky + em + (sweep + refit) * N / R (the first two do not
depend on N, the last two are linear in it); such estimates are marked "(est.)" and run low: smaller
row counts keep more in cache (measured: 1/16 of w2 predicted 52 s, the full fit then took 146 s).

Quality: (1) i.i.d. Gaussian weights, H = I: weight relative L2 error of ARVQ (the ARVQ write-up's greedy +
alternating search, and our beam) against the 2-bit Shannon bound 0.25 and Lloyd-Max scalar 0.343,
and RTN 2-bit; (2) the synthetic MoE with outlier activations (quant/synthetic.py): held-out output
relative error ||(W - Wq) X|| / ||W X|| per projection, pooled over the fitted experts, for RTN-2bit,
GPTQ-2bit and ARVQ init (the write-up's settings: plain-L2 greedy+alternating; ours: ldl metric + beam 8).
Needs only torch, numpy, safetensors, rich and blake3.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from quant import baselines, metrics, scales  # noqa: E402
from quant.fit import FitConfig, config_dict, fit_expert, fit_projection  # noqa: E402
from quant.format import bits_per_weight, decode  # noqa: E402
from quant.hessian import expert_hessian  # noqa: E402
from quant.synthetic import SyntheticConfig, build_layer  # noqa: E402

GLM = {"w13": (4096, 6144), "w2": (6144, 2048)}
SHANNON, LLOYD_MAX = 0.25, 0.3430
# the write-up's search and EM budget: plain L2, greedy + one alternating refinement, 20,000 groups, 8 EM steps
SEED_MODE = {"metric": "l2", "beam": 0, "inner_refine": 1, "sample_groups": 20_000, "kmeans_iters": 10,
             "em_iters": 8, "passes": 2}


def machine(device: str) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    out = {"cpu": cpu, "cores_visible": os.cpu_count(), "torch_threads": torch.get_num_threads(),
           "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name(0)
    return out


def synthetic_hessian(k: int, seed: int, device: str, rank: int = 256, heavy: int = 8) -> torch.Tensor:
    """A positive-definite K x K Hessian with LLM-like structure: low rank + spread diagonal + heavy columns."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(k, rank, generator=g)
    d = torch.exp(0.5 * torch.randn(k, generator=g))
    cols = torch.randperm(k, generator=g)[:heavy]
    d[cols] *= 400.0
    scale = d.sqrt()
    b, scale = b.to(device), scale.to(device)
    h = (b @ b.T) * (1.0 / rank) + torch.eye(k, device=device) * 0.5
    return h * scale[:, None] * scale[None, :]


def time_projection(name: str, rows: int, device: str, cfg: FitConfig) -> dict:
    """Fit the first `rows` rows of one GLM-sized expert projection; stage seconds and the full-N estimate."""
    n, k = GLM[name]
    h = synthetic_hessian(k, 1 if name == "w13" else 2, device)
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(rows, k, generator=g) * k ** -0.5).to(device)
    glob = scales.choose_global([scales.block_rms(w) / cfg.norm_rms])
    t0 = time.perf_counter()
    f = fit_expert(w, h, glob, cfg, f"benchmark {name}", seed=7)
    wall = time.perf_counter() - t0
    sec = f.stats["seconds"]
    fixed, per_row = sec["cholesky"] + sec["codebook_em"], (sec["sweep"] + sec["scale_refit"]) / rows
    return {"projection": name, "N": n, "K": k, "rows_fitted": rows, "seconds_measured": wall, "stages": sec,
            "damp_attempts": f.stats["damp_attempts"], "extrapolated": rows != n,
            "seconds_per_expert_full": fixed + per_row * n}


def gaussian_quality(n: int, k: int, cfg: FitConfig) -> dict:
    g = torch.Generator().manual_seed(11)
    w = torch.randn(n, k, generator=g)
    out = {"shape": [n, k], "shannon_2bit": SHANNON, "lloyd_max_2bit": LLOYD_MAX,
           "arvq_bits_per_weight": bits_per_weight(n, k)["total"],
           "rtn_bits_per_weight": baselines.bits_per_weight(n, k)}
    eye = torch.eye(k)
    for label, c in (("arvq_seed_search", replace(cfg, **SEED_MODE)), ("arvq", cfg)):
        p, _ = fit_projection([w], [eye], [0], layer=0, projection="w13", cfg=c)
        out[label] = metrics.weight_rel_error(w, decode(p, 0))
    out["rtn_2bit"] = metrics.weight_rel_error(w, baselines.rtn(w, baselines.global_for([w])))
    return out


def moe_quality(synth: SyntheticConfig, experts: list[int], cfg: FitConfig) -> list[dict]:
    cal, held = build_layer(synth, layer=3).split(0.25)
    rows = []
    for proj in ("w13", "w2"):
        ws = [cal.weight(proj, e) for e in experts]
        hs = [expert_hessian(cal, proj, e).h for e in experts]
        xs = [held.inputs(proj, e, held.routed(e)[0]) for e in experts]
        glob = baselines.global_for(ws)
        err = {"rtn_2bit": [metrics.output_sq(w, baselines.rtn(w, glob), x) for w, x in zip(ws, xs)],
               "gptq_2bit": [metrics.output_sq(w, baselines.gptq(w, h, glob, f"gptq {proj}"), x)
                             for w, h, x in zip(ws, hs, xs)]}
        for label, c in (("arvq_seed_search", replace(cfg, **SEED_MODE)), ("arvq", cfg)):
            p, _ = fit_projection(ws, hs, experts, layer=3, projection=proj, cfg=c)
            err[label] = [metrics.output_sq(w, decode(p, i), x) for i, (w, x) in enumerate(zip(ws, xs))]
        n, k = ws[0].shape
        rows.append({"projection": proj, "shape": [n, k], "experts": experts,
                     "held_out_tokens": [len(held.routed(e)[0]) for e in experts],
                     "arvq_bits_per_weight": bits_per_weight(n, k, len(experts))["total"],
                     "scalar_bits_per_weight": baselines.bits_per_weight(n, k, len(experts)),
                     **{key: metrics.pooled(v) for key, v in err.items()}})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--quick", action="store_true", help="smaller quality problems; CPU timing at 1/16 of N (est.)")
    ap.add_argument("--rows-w13", type=int, default=None, help="rows of w13 to fit (default: all; --quick CPU: N/16)")
    ap.add_argument("--rows-w2", type=int, default=None, help="rows of w2 to fit (default: all; --quick CPU: N/16)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--beam", type=int, default=None, help="beam width of EM and sweep (default: FitConfig's)")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--out", default="benchmarks/results/arvq_fit.json")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("arvq_fit: --device cuda but torch.cuda.is_available() is False")
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=max(Console().width, 120))  # the tables are wide; logs are not terminals
    cfg = FitConfig(device=args.device, **({} if args.beam is None else {"beam": args.beam}))
    frac = 16 if args.quick and args.device == "cpu" else 1
    result = {"command": "python3 " + " ".join(sys.argv), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "machine": machine(args.device), "fit_config": config_dict(cfg)}

    if not args.skip_timing:
        if args.device == "cuda":  # cuBLAS/cuSOLVER initialization is not the fit's cost
            time_projection("w2", 128, args.device, replace(cfg, sample_groups=2000, passes=1))
        rows = {"w13": args.rows_w13, "w2": args.rows_w2}
        timing = []
        for name, (n, _) in GLM.items():
            r = rows[name] or n // frac
            timing.append(time_projection(name, r, args.device, cfg))
            console.log(f"timed {name}: {timing[-1]['seconds_measured']:.1f} s for {r} rows")
        result["timing"] = timing
        t = Table(title=f"ARVQ initial fit, seconds per expert ({args.device}, {torch.get_num_threads()} threads)")
        for col in ("proj", "N x K", "rows fitted", "cholesky s", "EM s", "sweep s", "refit s", "measured s",
                    "s/expert (full N)"):
            t.add_column(col, justify="right")
        for r in timing:
            s = r["stages"]
            t.add_row(r["projection"], f"{r['N']}x{r['K']}", str(r["rows_fitted"]), f"{s['cholesky']:.2f}",
                      f"{s['codebook_em']:.2f}", f"{s['sweep']:.2f}", f"{s['scale_refit']:.2f}",
                      f"{r['seconds_measured']:.1f}",
                      f"{r['seconds_per_expert_full']:.1f}" + (" (est.)" if r["extrapolated"] else ""))
        console.print(t)

    if not args.skip_quality:
        gn, gk = (256, 1024) if args.quick else (1024, 1024)
        gauss = gaussian_quality(gn, gk, cfg)
        synth = (SyntheticConfig(hidden=512, ffn=256, experts=3, tokens=4096) if args.quick
                 else SyntheticConfig(hidden=1024, ffn=512, experts=4, tokens=8192))
        moe = moe_quality(synth, [0, 1] if args.quick else [0, 1, 2], cfg)
        result["quality"] = {"gaussian": gauss, "synthetic_moe": {"config": synth.__dict__, "rows": moe}}
        t = Table(title=f"i.i.d. Gaussian {gn}x{gk}, H = I: weight relative L2 error")
        for col in ("Shannon 2-bit", "Lloyd-Max 2-bit", "RTN 2-bit", "ARVQ (seed search)", f"ARVQ (beam {cfg.beam})",
                    "ARVQ bits/w"):
            t.add_column(col, justify="right")
        t.add_row(f"{SHANNON:.3f}", f"{LLOYD_MAX:.3f}", f"{gauss['rtn_2bit']:.4f}", f"{gauss['arvq_seed_search']:.4f}",
                  f"{gauss['arvq']:.4f}", f"{gauss['arvq_bits_per_weight']:.4f}")
        console.print(t)
        t = Table(title=f"synthetic MoE (hidden {synth.hidden}, ffn {synth.ffn}, outliers): held-out output rel. error")
        for col in ("proj", "N x K", "RTN 2-bit", "GPTQ 2-bit", "ARVQ (seed: l2, greedy)", f"ARVQ (ldl, beam {cfg.beam})",
                    "bits/w scalar", "bits/w ARVQ"):
            t.add_column(col, justify="right")
        for r in moe:
            t.add_row(r["projection"], "x".join(map(str, r["shape"])), f"{r['rtn_2bit']:.4f}", f"{r['gptq_2bit']:.4f}",
                      f"{r['arvq_seed_search']:.4f}", f"{r['arvq']:.4f}", f"{r['scalar_bits_per_weight']:.4f}",
                      f"{r['arvq_bits_per_weight']:.4f}")
        console.print(t)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=lambda o: o if not isinstance(o, float) or math.isfinite(o)
                              else str(o)) + "\n")
    console.print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
