"""The same model in stock PyTorch float32 (nn.Linear, SDPA or flex attention, torch RMSNorm, torch.optim.AdamW): the
speed baseline of benchmarks/train_step.py and benchmarks/train_throughput.py. Same shapes, same recipe; no BR ops,
no int8, no hashing.

`attention`: "sdpa" (scaled_dot_product_attention with the sliding window as a boolean mask: the fused kernels
take the mask, FlashAttention's does not), "flex" (flex_attention with a block mask that skips the tiles outside
the window: the stock way to a windowed flash kernel; it needs torch.compile and a GPU to be fast) or "mixed"
(flex on the windowed layers, SDPA's causal flash kernel on the global ones).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig


def _rope(t: int, hd: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def _rot(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, c: ModelConfig, i: int) -> None:
        super().__init__()
        self.c, self.i = c, i
        d, hd = c.d_model, c.head_dim
        self.attn_norm, self.ffn_norm = nn.RMSNorm(d, eps=c.norm_eps), nn.RMSNorm(d, eps=c.norm_eps)
        self.wqkv = nn.Linear(d, (c.n_heads + 2 * c.n_kv_heads) * hd, bias=False)
        self.wo = nn.Linear(c.n_heads * hd, d, bias=False)
        self.w_gate_up = nn.Linear(d, 2 * c.ffn_hidden, bias=False)
        self.w_down = nn.Linear(c.ffn_hidden, d, bias=False)

    def forward(self, h: torch.Tensor, rope, mask: torch.Tensor | None) -> torch.Tensor:
        c = self.c
        b, t, _ = h.shape
        q, k, v = self.wqkv(self.attn_norm(h)).split(
            [c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim], dim=-1)
        q = q.view(b, t, c.n_heads, c.head_dim).transpose(1, 2)
        k = k.view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(b, t, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q = _rot(F.rms_norm(q, (c.head_dim,), eps=c.norm_eps), *rope)
        k = _rot(F.rms_norm(k, (c.head_dim,), eps=c.norm_eps), *rope)
        if isinstance(mask, torch.Tensor) or mask is None:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        else:
            from torch.nn.attention.flex_attention import flex_attention

            o = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        h = h + self.wo(o.transpose(1, 2).reshape(b, t, -1))
        g, u = self.w_gate_up(self.ffn_norm(h)).chunk(2, dim=-1)
        return h + self.w_down(F.silu(g) * u)


class StockModel(nn.Module):
    """Dense OPEN-1B-shaped transformer in plain float32 PyTorch."""

    def __init__(self, c: ModelConfig, attention: str = "sdpa") -> None:
        super().__init__()
        if attention not in ("sdpa", "flex", "mixed"):
            raise ValueError(f"StockModel: attention must be 'sdpa', 'flex' or 'mixed', got {attention!r}")
        self.c, self.attention = c, attention
        self._block_masks: dict = {}
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.embed_norm, self.final_norm = nn.RMSNorm(c.d_model, eps=c.norm_eps), nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.blocks = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.trunc_normal_(p, std=c.init_std, a=-2 * c.init_std, b=2 * c.init_std)
        cos, sin = _rope(c.seq_len, c.head_dim, c.rope_theta)
        self.register_buffer("cos", cos, persistent=False)  # buffers: .to(device/dtype) moves them too
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, ids: torch.Tensor, z_loss: float = 1e-4) -> torch.Tensor:
        x, y = ids[:, :-1], ids[:, 1:]
        t = x.shape[1]
        h = self.embed_norm(self.embed(x))
        for blk in self.blocks:
            h = blk(h, (self.cos[:t], self.sin[:t]), self._mask(self.c.window_of(blk.i), t, h.device))
        logits = self.head(self.final_norm(h)).flatten(0, 1)
        lse = torch.logsumexp(logits, dim=-1)
        ce = F.cross_entropy(logits, y.flatten())
        return ce + z_loss * (lse * lse).mean()

    def prepare(self, t: int) -> "StockModel":
        """Flex: build the block masks of sequence length t on the model's device once, outside torch.compile."""
        if self.attention != "sdpa":
            from torch.nn.attention.flex_attention import create_block_mask

            for w in {self.c.window_of(i) for i in range(self.c.n_layers)}:
                def visible(b, h, q, kv, w=w):
                    return (kv <= q) if w is None else (kv <= q) & (kv > q - w)

                self._block_masks[(w, t)] = create_block_mask(visible, None, None, t, t, device=self.cos.device)
        return self

    def _mask(self, w: int | None, t: int, device: torch.device):
        """SDPA: None (causal) or the [t, t] window mask; flex: the block mask `prepare` built; mixed: flex's
        for a window, SDPA's None for a global layer."""
        if self.attention == "flex" or (self.attention == "mixed" and w is not None):
            return self._block_masks[(w, t)]
        i = torch.arange(t, device=device)
        return None if w is None else (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - w)
