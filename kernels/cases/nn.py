"""Cases for the model's layer ops: RMSNorm, RoPE, SwiGLU, embedding, and the AdamW step."""
from __future__ import annotations

import torch

from kernels.cases import Case, leaf, seed_of
from kernels.ref import philox
from kernels.ref.adamw import adamw_step, clip_coefficient
from kernels.ref.embedding import embedding
from kernels.ref.rmsnorm import rmsnorm
from kernels.ref.rope import apply_rope, rope_tables
from kernels.ref.swiglu import swiglu


def _label(shape) -> str:
    return "x".join(map(str, shape))


def _normal(name: str, shape, std: float = 1.0) -> torch.Tensor:
    return philox.normal(seed_of(name), 0, shape, std=std)


def _rmsnorm_case(shape, gain: bool) -> Case:
    op = "rmsnorm" if gain else "rmsnorm_nogain"
    label = _label(shape)

    def run(dev):
        x = leaf(_normal(f"{op}{label}/x", shape, 3.0), dev)
        w = leaf(1.0 + _normal(f"{op}{label}/w", shape[-1:], 0.1), dev) if gain else None
        y = rmsnorm(x, w)
        y.backward(_normal(f"{op}{label}/g", shape).to(dev))
        out = {"y": y, "dx": x.grad}
        if gain:
            out["dweight"] = w.grad
        return out
    return Case(op, label, run)


def _rope_case(shape) -> Case:
    label = _label(shape)
    t, d = shape[-2], shape[-1]

    def run(dev):
        cos, sin = rope_tables(t, d, device=dev)
        x = leaf(_normal(f"rope{label}/x", shape), dev)
        y = apply_rope(x, cos, sin)
        y.backward(_normal(f"rope{label}/g", shape).to(dev))
        return {"cos": cos, "sin": sin, "y": y, "dx": x.grad}
    return Case("rope", label, run)


def _rope_tables_case(seq_len: int, head_dim: int) -> Case:
    def run(dev):
        cos, sin = rope_tables(seq_len, head_dim, device=dev)
        return {"cos": cos, "sin": sin}
    return Case("rope_tables", f"{seq_len}x{head_dim}", run)


def _swiglu_case(shape) -> Case:
    label = _label(shape)

    def run(dev):
        x = leaf(_normal(f"swiglu{label}/x", shape, 3.0), dev)
        y = swiglu(x)
        y.backward(_normal(f"swiglu{label}/g", tuple(y.shape)).to(dev))
        return {"y": y, "dx": x.grad}
    return Case("swiglu", label, run)


def _embedding_case(vocab: int, dim: int, ids_shape, used: int, dtype=torch.float32) -> Case:
    """ids drawn from the first `used` rows only: many duplicates, and rows that get exactly 0."""
    label = f"{vocab}x{dim}/{_label(ids_shape)}/{str(dtype).removeprefix('torch.')}"

    def run(dev):
        n = 1
        for s in ids_shape:
            n *= s
        ids = (philox.random_bits(seed_of(f"emb{label}/ids"), 0, n) % used).reshape(ids_shape).to(dev)
        w = leaf(_normal(f"emb{label}/w", (vocab, dim), 0.02).to(dtype), dev)
        y = embedding(ids, w)
        y.backward(_normal(f"emb{label}/g", (*ids_shape, dim)).to(dtype).to(dev))
        return {"y": y, "dweight": w.grad}
    return Case("embedding", label, run)


def _adamw_case(shape, dtype, first_step: int, weight_decay: float) -> Case:
    label = f"{_label(shape)}/{str(dtype).removeprefix('torch.')}/t{first_step}"

    def run(dev):
        p = _normal(f"adamw{label}/p", shape, 0.02).to(dtype).to(dev)
        m = torch.zeros(shape, dtype=torch.float32, device=dev)
        v = torch.zeros(shape, dtype=torch.float32, device=dev)
        out = {}
        for k in range(3):  # three consecutive steps: the moments carry state between them
            g = _normal(f"adamw{label}/g{k}", shape, 0.01).to(dtype).to(dev)
            adamw_step(p, g, m, v, step=first_step + k, lr=4.5e-4, weight_decay=weight_decay)
            out.update({f"param{k}": p.clone(), f"m{k}": m.clone(), f"v{k}": v.clone()})
        return out
    return Case("adamw", label, run)


def _clip_case() -> Case:
    def run(dev):
        norms = [0.0, 0.25, 1.0, 1.0 + 2**-20, 3.0, 1e30]
        return {f"coef{i}": clip_coefficient(torch.tensor(n, dtype=torch.float32, device=dev), 1.0)
                for i, n in enumerate(norms)}
    return Case("clip_coefficient", "max1", run)


CASES: list[Case] = [
    *[_rmsnorm_case(s, True) for s in [(7, 33), (3, 5, 100), (13, 384)]],
    *[_rmsnorm_case(s, False) for s in [(1, 1), (2, 4, 7, 8), (2, 7, 128)]],
    *[_rope_case(s) for s in [(1, 2, 7, 8), (2, 3, 33, 64), (1, 1, 130, 128)]],
    _rope_tables_case(4096, 8),
    *[_swiglu_case(s) for s in [(1, 2), (7, 66), (3, 5, 200), (13, 768)]],
    _embedding_case(11, 8, (7,), 3),
    _embedding_case(100, 33, (4, 130), 10),
    _embedding_case(1000, 16, (2, 257), 700),
    _embedding_case(100, 33, (4, 130), 10, torch.bfloat16),
    *[_adamw_case(s, dt, t, wd) for dt in (torch.float32, torch.bfloat16)
      for s, t, wd in [((100,), 1, 0.0), ((7, 33), 1, 0.1), ((13, 384), 998, 0.1)]],
    _clip_case(),
]
