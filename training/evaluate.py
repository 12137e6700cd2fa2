"""Held-out cross-entropy on a fixed token set, and per-layer weight norms (report 3.4.1 and figure 4).

The held-out set is windows heldout_window + i * heldout_stride (i < heldout_windows) of the canonical
stream: a fixed token set spread over many documents, which no training step may read (run_step refuses
windows at or past heldout_window).
Both measures use kernels ops, so they too are the same on every machine.
"""
from __future__ import annotations

import torch

import stream
from training.config import RunConfig
from training.model import forward, rope_for
from kernels.ref.reduce import exact_mean, global_l2_norm


def heldout_tokens(cfg: RunConfig, device: torch.device | str = "cpu") -> torch.Tensor | None:
    """The held-out windows [n, seq_len + 1] (int64), read from a stream of their own; None if disabled."""
    t = cfg.train
    if not t.heldout_windows:
        return None
    s = stream.open_stream(t.corpus, seq_len=cfg.model.seq_len, seed=t.seed)
    s.advance(t.heldout_window)
    w = s.take(range(t.heldout_window, t.heldout_window + t.heldout_windows * t.heldout_stride, t.heldout_stride))
    return torch.from_numpy(w).to(torch.int64).to(device)


@torch.no_grad()
def heldout_ce(params: dict[str, torch.Tensor], cfg: RunConfig, tokens: torch.Tensor,
               rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> float:
    """Mean over the held-out windows of each window's next-token cross-entropy (run micro_batch windows at a time:
    no bit depends on it)."""
    p32 = {k: v.to(torch.float32) for k, v in params.items()}
    rope = rope if rope is not None else rope_for(cfg.model, tokens.device)
    mb = cfg.train.micro_batch
    ces = [forward(p32, cfg.model, tokens[i:i + mb], rope, z_loss=cfg.train.z_loss).ce
           for i in range(0, tokens.shape[0], mb)]
    return float(exact_mean(torch.cat(ces), dim=0))


def weight_norms(params: dict[str, torch.Tensor], cfg: RunConfig) -> dict[str, float]:
    """Frobenius norms: embedding, head, and per layer W_Q, W_K, W_V (rows of the fused Wqkv), W_O and the FFN."""
    m = cfg.model
    hd = m.head_dim
    out = {"embed": float(global_l2_norm([params["embed.weight"]])),
           "head": float(global_l2_norm([params["head.weight"]]))}
    for i in range(m.n_layers):
        wqkv = params[f"layers.{i}.attn.wqkv.weight"]
        q, k, v = wqkv.split([m.n_heads * hd, m.n_kv_heads * hd, m.n_kv_heads * hd], dim=0)
        out[f"layers.{i}.wq"] = float(global_l2_norm([q]))
        out[f"layers.{i}.wk"] = float(global_l2_norm([k]))
        out[f"layers.{i}.wv"] = float(global_l2_norm([v]))
        out[f"layers.{i}.wo"] = float(global_l2_norm([params[f"layers.{i}.attn.wo.weight"]]))
        ffn = [t for n, t in params.items() if n.startswith(f"layers.{i}.") and n.endswith(".weight")
               and (".ffn." in n or ".moe." in n)]
        out[f"layers.{i}.ffn"] = float(global_l2_norm(ffn))
    return out
