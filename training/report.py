"""`python -m app report --run RUN`: the run's loss curves, gradient-norm trajectory with the report's table 9
statistics, per-layer weight norms (the report's figure 4) and step times, as PNGs plus report.json."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI or a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from stream.fileio import atomic_path, atomic_write_json  # noqa: E402
from training.errors import RunDirError  # noqa: E402
from training.rundir import HASHLOG, METRICS, read_jsonl  # noqa: E402


def _save(fig, out: Path) -> Path:
    """Lay `fig` out, write it to the PNG `out` atomically and free it."""
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)
    return out


def _steps(run: Path) -> list[dict]:
    recs = [r for r in read_jsonl(run / HASHLOG) if r["step"] >= 0]
    if not recs:
        raise RunDirError(f"{run / HASHLOG}: no step records; is {run} a run directory?")
    return recs


def _evals(run: Path) -> list[dict]:
    return [r for r in read_jsonl(run / METRICS) if r.get("event") == "eval"]


def plot_losses(run: str | Path, path: str | Path | None = None) -> Path:
    """Training loss (per step, and a 20-step mean) and held-out CE against tokens: loss.png."""
    run = Path(run)
    recs, evals = _steps(run), [e for e in _evals(run) if "heldout_ce" in e]
    tok = np.array([r["tokens"] for r in recs], dtype=np.float64)
    ce = np.array([r["ce"] for r in recs], dtype=np.float64)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(tok, ce, lw=0.6, alpha=0.5, label="training CE (per step)")
    k = min(20, len(ce))
    if k > 1:
        ax.plot(tok[k - 1:], np.convolve(ce, np.ones(k) / k, mode="valid"), lw=1.5, label=f"training CE ({k}-step mean)")
    if evals:
        ax.plot([e["tokens"] for e in evals], [e["heldout_ce"] for e in evals], "o-", lw=1.5, label="held-out CE")
    ax.set_xlabel("tokens")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(f"{run.name}: loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, Path(path) if path else run / "loss.png")


def grad_norm_stats(recs: list[dict], steady_after: int = 0) -> dict[str, float]:
    """Table 9 of the report for the records with step > steady_after: quantiles, max, clip and skip counts."""
    sel = [r for r in recs if r["step"] > steady_after] if steady_after else recs
    g = np.array([r["grad_norm"] for r in sel], dtype=np.float64)
    if not g.size:
        return {}
    imax = int(np.argmax(g))
    return {"steps": int(g.size), "median": float(np.median(g)), "mean": float(g.mean()),
            "p95": float(np.percentile(g, 95)), "p99": float(np.percentile(g, 99)), "max": float(g[imax]),
            "max_step": int(sel[imax]["step"]), "clip_engaged": int((g > 1.0).sum()),
            "clip_rate": float((g > 1.0).mean()), "above_2": int((g > 2.0).sum()),
            "skipped": int(sum(1 for r in sel if r["skipped"])),
            "spike_events": int(sum(1 for r in sel if r.get("spike_trigger")))}


def plot_grad_norms(run: Path, recs: list[dict]) -> Path:
    steps = np.array([r["step"] for r in recs])
    g = np.array([r["grad_norm"] for r in recs], dtype=np.float64)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 1]})
    a.plot(steps, g, lw=0.7)
    a.axhline(1.0, color="tab:orange", ls="--", lw=1, label="clip 1.0")
    a.axhline(5.0, color="tab:red", ls=":", lw=1, label="spike 5.0")
    sk = [r["step"] for r in recs if r["skipped"]]
    if sk:
        a.plot(sk, [r["grad_norm"] for r in recs if r["skipped"]], "x", color="tab:red", label="skipped")
    a.set_yscale("log")
    a.set_xlabel("step")
    a.set_ylabel("pre-clip gradient norm")
    a.legend()
    a.grid(alpha=0.3)
    b.hist(np.log10(g[g > 0]), bins=40, orientation="horizontal")
    b.set_xlabel("steps")
    b.set_ylabel("log10 norm")
    fig.suptitle(f"{run.name}: gradient norm")
    return _save(fig, run / "grad_norm.png")


def plot_weight_norms(run: Path, evals: list[dict]) -> Path | None:
    """Per-layer Frobenius norms of W_Q, W_K, W_V, W_O, the FFN and the embeddings over tokens."""
    evals = [e for e in evals if "weight_norms" in e]
    if not evals:
        return None
    tok = [e["tokens"] for e in evals]
    keys = evals[0]["weight_norms"].keys()
    layers = sorted({int(k.split(".")[1]) for k in keys if k.startswith("layers.")})
    kinds = ["wq", "wk", "wv", "wo", "ffn"]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    cmap = plt.get_cmap("viridis")
    for ax, kind in zip(axes.flat, kinds):
        for i in layers:
            ax.plot(tok, [e["weight_norms"][f"layers.{i}.{kind}"] for e in evals],
                    color=cmap(i / max(1, len(layers) - 1)), label=f"layer {i}")
        ax.set_title(kind)
        ax.grid(alpha=0.3)
    ax = axes.flat[5]
    for k in ("embed", "head"):
        ax.plot(tok, [e["weight_norms"][k] for e in evals], label=k)
    ax.set_title("embedding / LM head")
    ax.legend()
    ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("tokens")
    fig.suptitle(f"{run.name}: weight norms per layer")
    return _save(fig, run / "weight_norms.png")


def plot_step_times(run: Path) -> Path | None:
    """Each step's own seconds (its run, its hashing and logging; metrics.jsonl) and tokens/s: step_time.png.
    A resumed run has a step's timing more than once: the last one is plotted (the run that logged it)."""
    last = {r["step"]: r for r in read_jsonl(run / METRICS) if r.get("event") == "step"}
    if not last:
        return None
    steps = sorted(last)
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    a.plot(steps, [last[s]["seconds"] for s in steps], lw=0.8, label="step")
    a.plot(steps, [last[s]["hash_seconds"] for s in steps], lw=0.8, label="of it: hashing")
    a.set_ylabel("seconds")
    a.legend()
    b.plot(steps, [last[s]["tokens_per_s"] for s in steps], lw=0.8)
    b.set_ylabel("tokens / s")
    b.set_xlabel("step")
    a.set_title(f"{run.name}: step time")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return _save(fig, run / "step_time.png")


def report(run: str | Path, steady_after: int | None = None) -> dict:
    """Write loss.png, grad_norm.png, weight_norms.png and report.json into the run; returns the report."""
    run = Path(run)
    recs, evals = _steps(run), _evals(run)
    if steady_after is None:
        steady_after = min(len(recs) // 10, 1300)  # the report's 1,300-step warmup, scaled to short runs
    out = {"run": str(run), "steps": len(recs), "tokens": recs[-1]["tokens"], "run_hash": recs[-1]["chain_hash"],
           "grad_norm": {"full": grad_norm_stats(recs), f"steady (step > {steady_after})":
                         grad_norm_stats(recs, steady_after)},
           "heldout": [(e["step"], e["heldout_ce"]) for e in evals if "heldout_ce" in e],
           "files": [str(plot_losses(run)), str(plot_grad_norms(run, recs))]}
    for extra in (plot_weight_norms(run, evals), plot_step_times(run)):
        if extra:
            out["files"].append(str(extra))
    atomic_write_json(run / "report.json", out)
    return out


def main(run: str, steady_after: int | None = None) -> int:
    """CLI entry: write the report and print table 9."""
    from rich.console import Console
    from rich.table import Table

    rep = report(run, steady_after)
    t = Table(title=f"pre-clip gradient norm over {rep['steps']} steps (report table 9)")
    cols = list(rep["grad_norm"])
    t.add_column("")
    for c in cols:
        t.add_column(c)
    rows = [("median", "median"), ("mean", "mean"), ("95th percentile", "p95"), ("99th percentile", "p99"),
            ("maximum", "max"), ("steps with |g| > 1 (clip engaged)", "clip_engaged"), ("steps with |g| > 2", "above_2"),
            ("skipped steps (|g| > 5 net)", "skipped")]
    for label, key in rows:
        vals = []
        for c in cols:
            s = rep["grad_norm"][c]
            v = s.get(key)
            if key == "max" and v is not None:
                vals.append(f"{v:.3g} (step {s['max_step']})")
            elif key == "clip_engaged" and v is not None:
                vals.append(f"{v} ({100 * s['clip_rate']:.2f}%)")
            else:
                vals.append("-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v)))
        t.add_row(label, *vals)
    con = Console()
    con.print(t)
    if rep["heldout"]:
        con.print(f"held-out CE: {rep['heldout'][0][1]:.4f} (step {rep['heldout'][0][0]}) -> "
                  f"{rep['heldout'][-1][1]:.4f} (step {rep['heldout'][-1][0]})")
    for f in rep["files"]:
        con.print(f"wrote {f}")
    con.print(f"run hash {rep['run_hash']}")
    return 0
