"""The site's plots over steps (PNG, matplotlib): loss, gradient norm, learning rate, weight norms and held-out
CE, each with the skipped (spike) steps and the topology changes (resizes) marked, so a jump in a curve can be
read against the events that explain it. training/report.py plots the same numbers against tokens."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

DPI = 90
WEIGHT_KINDS = ("wq", "wk", "wv", "wo", "ffn")


def events(records: list[dict]) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """(the skipped steps, [(step, topology)] where the topology changed from the step before)."""
    skipped = np.array([r["step"] for r in records if r.get("skipped")], dtype=np.int64)
    resizes = [(b["step"], b["topology"]) for a, b in zip(records, records[1:]) if a["topology"] != b["topology"]]
    return skipped, resizes


def _mark(ax, skipped: np.ndarray, resizes: list[tuple[int, str]]) -> list:
    """Skipped steps as thin red lines, resizes as dashed black lines (labelled while few); legend handles."""
    handles = []
    if skipped.size:
        ax.vlines(skipped, 0, 1, transform=ax.get_xaxis_transform(), color="tab:red", alpha=0.25, lw=0.8)
        handles.append(Line2D([], [], color="tab:red", alpha=0.5, label=f"skipped step ({skipped.size})"))
    if resizes:
        ax.vlines([s for s, _ in resizes], 0, 1, transform=ax.get_xaxis_transform(), color="black", ls="--", lw=0.9)
        if len(resizes) <= 12:
            for s, topo in resizes:
                ax.text(s, 0.98, f" {topo}", transform=ax.get_xaxis_transform(), va="top", fontsize=7)
        handles.append(Line2D([], [], color="black", ls="--", label=f"topology change ({len(resizes)})"))
    return handles


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return path


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([r["step"] for r in records], dtype=np.int64),
            np.array([r.get(key, np.nan) for r in records], dtype=np.float64))


def plot_loss(records: list[dict], evals: list[dict], path: Path) -> Path:
    """Training loss and CE per step, held-out CE at the evaluations."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    steps, loss = _series(records, "loss")
    ax.plot(steps, loss, lw=0.7, label="loss (CE + z-loss)")
    ax.plot(steps, _series(records, "ce")[1], lw=0.7, label="training CE")
    held = [e for e in evals if "heldout_ce" in e]
    if held:
        ax.plot([e["step"] for e in held], [e["heldout_ce"] for e in held], "o-", ms=3, lw=1, label="held-out CE")
    handles = _mark(ax, *events(records))
    ax.set_xlabel("step")
    ax.set_ylabel("nats")
    ax.set_title("loss")
    ax.grid(alpha=0.3)
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=8)
    return _save(fig, path)


def plot_grad_norm(records: list[dict], clip: float, spike: float, path: Path) -> Path:
    """The pre-clip gradient norm (log scale) with the clip and spike thresholds."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    steps, g = _series(records, "grad_norm")
    ax.plot(steps, g, lw=0.7, label="pre-clip gradient norm")
    ax.axhline(clip, color="tab:orange", ls="--", lw=1, label=f"clip {clip:g}")
    ax.axhline(spike, color="tab:red", ls=":", lw=1, label=f"spike {spike:g}")
    if np.all(g[np.isfinite(g)] > 0):
        ax.set_yscale("log")
    handles = _mark(ax, *events(records))
    ax.set_xlabel("step")
    ax.set_title("gradient norm")
    ax.grid(alpha=0.3)
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=8)
    return _save(fig, path)


def plot_lr(records: list[dict], path: Path) -> Path:
    """The learning rate each step used (token-anchored warmup and cosine; a skipped step logs it unapplied)."""
    fig, ax = plt.subplots(figsize=(9, 3.0))
    steps, lr = _series(records, "lr")
    ax.plot(steps, lr, lw=1, label="learning rate")
    handles = _mark(ax, *events(records))
    ax.set_xlabel("step")
    ax.set_title("learning rate")
    ax.grid(alpha=0.3)
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=8)
    return _save(fig, path)


def plot_heldout(records: list[dict], evals: list[dict], path: Path) -> Path | None:
    """Held-out CE at each evaluation (None when the run evaluated none)."""
    held = [e for e in evals if "heldout_ce" in e]
    if not held:
        return None
    fig, ax = plt.subplots(figsize=(9, 3.0))
    ax.plot([e["step"] for e in held], [e["heldout_ce"] for e in held], "o-", ms=3, lw=1, label="held-out CE")
    handles = _mark(ax, *events(records))
    ax.set_xlabel("step (evaluated after this many steps)")
    ax.set_ylabel("nats")
    ax.set_title("held-out cross-entropy")
    ax.grid(alpha=0.3)
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=8)
    return _save(fig, path)


def plot_weight_norms(records: list[dict], evals: list[dict], path: Path) -> Path | None:
    """Per-layer Frobenius norms of W_Q, W_K, W_V, W_O, the FFN, the embedding and the LM head at each evaluation."""
    evals = [e for e in evals if "weight_norms" in e]
    if not evals:
        return None
    steps = [e["step"] for e in evals]
    keys = evals[0]["weight_norms"]
    layers = sorted({int(k.split(".")[1]) for k in keys if k.startswith("layers.")})
    fig, axes = plt.subplots(2, 3, figsize=(11, 5.5), sharex=True)
    cmap = plt.get_cmap("viridis")
    marks = events(records)
    for ax, kind in zip(axes.flat, WEIGHT_KINDS):
        for i in layers:
            key = f"layers.{i}.{kind}"
            if key in keys:
                ax.plot(steps, [e["weight_norms"].get(key, np.nan) for e in evals],
                        color=cmap(i / max(1, len(layers) - 1)), lw=1, label=f"layer {i}")
        _mark(ax, *marks)
        ax.set_title(kind, fontsize=9)
        ax.grid(alpha=0.3)
    ax = axes.flat[5]
    for k in ("embed", "head"):
        if k in keys:
            ax.plot(steps, [e["weight_norms"].get(k, np.nan) for e in evals], lw=1, label=k)
    handles = _mark(ax, *marks)
    ax.set_title("embedding / LM head", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(handles=ax.get_legend_handles_labels()[0] + handles, fontsize=7)
    if len(layers) <= 8:
        axes.flat[0].legend(fontsize=7)
    for ax in axes[1]:
        ax.set_xlabel("step")
    fig.suptitle("weight norms per layer")
    return _save(fig, path)
