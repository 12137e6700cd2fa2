"""`python -m app quant fit`: capture, hot/cold split, initial fit of the cold experts, held-out errors, packed export.

Until the project's MoE exists, the only model is `synthetic[:seed]` (quant/synthetic.py): one synthetic
MoE block per requested layer. Each layer: captured tokens are split into calibration and held-out
parts; REAP saliency on the calibration part picks the hot experts (over all requested layers together
by default); every cold expert's w13 and w2 is fitted, measured on held-out tokens, verified and written
(quant/store.py). Events go to OUT/fit_log.jsonl, one JSON object per line.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quant import baselines, metrics, saliency, store
from quant.capture import PROJECTIONS, LayerCapture
from quant.errors import ConfigError, where
from quant.fit import FitConfig, config_dict, fit_projection
from quant.format import bits_per_weight, decode
from quant.hessian import expert_hessian
from quant.synthetic import SyntheticConfig, build_layer


def parse_layers(spec: str) -> list[int]:
    """'3', '3-5' or '3,5,9' (or a mix) -> sorted distinct layer ids."""
    out: set[int] = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError(f"--layers: expected e.g. '3', '3-5' or '3,5', got {spec!r}") from None
    if not out or min(out) < 0:
        raise ConfigError(f"--layers: expected non-negative layer ids, got {spec!r}")
    return sorted(out)


def load_captures(model: str, layers: list[int], synth: SyntheticConfig) -> list[LayerCapture]:
    """Captured layers of `model`: only `synthetic[:seed]` exists until the project's MoE does."""
    name, _, seed = model.partition(":")
    if name != "synthetic":
        raise ConfigError(f"--model {model!r}: the project's MoE is not available to quant yet; "
                          f"use --model synthetic[:SEED]")
    try:
        cfg = replace(synth, seed=int(seed)) if seed else synth
    except ValueError:
        raise ConfigError(f"--model {model!r}: the seed after 'synthetic:' must be an integer") from None
    return [build_layer(cfg, layer) for layer in layers]


class _Log:
    """One JSON object per line in OUT/fit_log.jsonl."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a")

    def __call__(self, event: str, **kw) -> None:
        self.f.write(json.dumps({"t": round(time.time(), 3), "event": event, **kw}, default=float) + "\n")
        self.f.flush()


def _fit_layer(cap: LayerCapture, held: LayerCapture, cold: list[int], cfg: FitConfig, compare: bool,
               progress: Progress, log: _Log) -> tuple[dict, list[dict]]:
    """Fit one layer's cold experts; (projections, summary rows)."""
    projs, rows = {}, []
    for proj in PROJECTIONS:
        task = progress.add_task(f"layer {cap.layer} {proj}", total=len(cold))
        hs = [expert_hessian(cap, proj, e, cfg.min_tokens) for e in cold]
        ws = [cap.weight(proj, e) for e in cold]

        def tick(e: int, st: dict) -> None:
            progress.update(task, advance=1, description=f"layer {cap.layer} {proj} expert {e} "
                                                          f"({sum(st['seconds'].values()):.1f}s)")
            log("expert_fit", layer=cap.layer, projection=proj, expert=e, **st)
        t0 = time.perf_counter()
        p, stats = fit_projection(ws, [h.h for h in hs], cold, layer=cap.layer, projection=proj, cfg=cfg,
                                  progress=tick)
        seconds = time.perf_counter() - t0
        err = {"arvq": [], "rtn": [], "gptq": []}
        glob = baselines.global_for(ws) if compare else None
        wrel = []
        for slot, (e, w, h) in enumerate(zip(cold, ws, hs)):
            tok = held.routed(e)[0]
            wq = decode(p, slot)
            wrel.append(metrics.weight_rel_error(w, wq))
            if not len(tok):
                continue  # no held-out token reached this expert: nothing to measure on
            x = held.inputs(proj, e, tok)
            err["arvq"].append(metrics.output_sq(w, wq, x))
            if compare:
                err["rtn"].append(metrics.output_sq(w, baselines.rtn(w, glob), x))
                err["gptq"].append(metrics.output_sq(w, baselines.gptq(w, h.h, glob, where(cap.layer, e, proj)), x))
        n, k = p.shape
        row = {"layer": cap.layer, "projection": proj, "cold": len(cold), "shape": [n, k],
               "bits_per_weight": bits_per_weight(n, k, len(cold))["total"],
               "fallback_experts": [e for e, h in zip(cold, hs) if h.fallback],
               "max_damp_attempts": max(s["damp_attempts"] for s in stats),
               "weight_rel_error": sum(wrel) / len(wrel), "seconds": seconds,
               "held_out_rel_error": {k2: metrics.pooled(v) for k2, v in err.items() if v}}
        log("projection_done", **row)
        projs[proj] = p
        rows.append(row)
    return projs, rows


def fit_main(model: str, layers: str, out: str, *, hot_count: int | None = None, hot_share: float | None = 0.3,
             hot_scope: str = "global", text_weight: float = 0.75, held_out: float = 0.25, compare: bool = True,
             synth: SyntheticConfig = SyntheticConfig(), cfg: FitConfig = FitConfig(),
             console: Console | None = None) -> int:
    """The whole `quant fit` command; 0 on success (errors raise, naming layer/expert/projection/file)."""
    console = console or Console()
    if hot_count is not None:
        hot_share = None
    outp = Path(out)
    outp.mkdir(parents=True, exist_ok=True)
    log = _Log(outp / "fit_log.jsonl")
    log("start", model=model, layers=layers, config=config_dict(cfg))
    caps = load_captures(model, parse_layers(layers), synth)
    splits = {c.layer: c.split(held_out) for c in caps}
    scores = {layer: saliency.mixed_scores(cal, text_weight) for layer, (cal, _) in splits.items()}
    hot = saliency.select_hot(scores, count=hot_count, share=hot_share, scope=hot_scope)
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        for layer, (cal, held) in splits.items():
            cold = [e for e in range(cal.n_experts) if e not in hot[layer]]
            log("split", layer=layer, hot=hot[layer], cold=cold, saliency=[float(s) for s in scores[layer]])
            if not cold:
                continue
            projs, lrows = _fit_layer(cal, held, cold, cfg, compare, progress, log)
            store.write_layer(out, layer, projs, meta={"model": model, "hot": hot[layer], "cold": cold,
                                                       "summary": lrows, "fit_config": config_dict(cfg)})
            rows += lrows
    table = Table(title=f"ARVQ initial fit: {model} -> {out}",
                  caption="held-out output error ||(W - Wq) X|| / ||W X||, pooled over cold experts; "
                          "fb: experts on the all-token Hessian; W rel: ||W - Wq|| / ||W||")
    for col in ("L", "proj", "cold", "bits/w", "fb", "damp", "W rel", "ARVQ", "RTN2", "GPTQ2", "s"):
        table.add_column(col, justify="right")
    n_exp = {c.layer: c.n_experts for c in caps}
    for r in rows:
        e = r["held_out_rel_error"]
        fmt = lambda k: f"{e[k]:.3f}" if k in e else "-"
        table.add_row(str(r["layer"]), r["projection"], f"{r['cold']}/{n_exp[r['layer']]}",
                      f"{r['bits_per_weight']:.4f}", str(len(r["fallback_experts"])), str(r["max_damp_attempts"]),
                      f"{r['weight_rel_error']:.3f}", fmt("arvq"), fmt("rtn"), fmt("gptq"), f"{r['seconds']:.1f}")
    console.print(table)
    log("done", rows=len(rows))
    return 0


def fit_cli(model: str, layers: str, out: str, synth: SyntheticConfig, cfg: FitConfig, threads: int = 0,
            **split) -> int:
    """`quant fit`: fit_main with the command line's configs; `split`: fit_main's hot/cold split and comparison."""
    if threads < 0:
        raise ConfigError(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)  # the fit is many small ops: on shared cores, fewer threads spin less
    return fit_main(model, layers, out, synth=synth, cfg=cfg, **split)
