"""A Hugging Face MoE model with its cold experts replaced by the ARVQ experts `quant run` published.

    model = load_quantized("ckpt/", "arvq-out/")     # a transformers model: generate(), forward(labels=...)

Before any module is touched: the checkpoint is checked (quant.hf_checkpoint), every file it was published
from must have the blake3 the output recorded (a different or changed checkpoint is refused, naming the
file), and every published layer is read back with its digests verified (quant.store). Then each MoE block's
experts module becomes an ArvqExperts: the same forward signature as transformers' fused experts, the hot
experts dense (the checkpoint's weights), the cold ones kept as codes (rvq256_256x8: 2 x 8-bit indices per 8
weights, FP4 atoms, E4M3 block scales; buffers, so model.to(device) moves them) and used when a token reaches
them: on CUDA through the Triton decode-and-multiply kernel (quant/rvq_triton.py), elsewhere decoded by
quant.format's decoder and multiplied by F.linear.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from quant import store
from quant.errors import FormatError, IntegrityError
from quant.format import RVQProjection, decode_parts
from quant.fp_formats import fp4_decode
from quant.hf_checkpoint import Checkpoint, open_checkpoint
from quant.hf_donor import load_model

PROJS = ("w13", "w2")


class ArvqExperts(nn.Module):
    """Drop-in for transformers' fused experts module: forward(hidden [N, D], top_k_index, top_k_weights)."""

    def __init__(self, dense: dict[int, tuple[torch.Tensor, torch.Tensor]], packed: dict[str, RVQProjection],
                 n_experts: int, act: nn.Module) -> None:
        super().__init__()
        self.num_experts, self.act_fn = n_experts, act
        # "auto": the Triton decode-and-multiply kernel on CUDA, decode + F.linear elsewhere; or "triton", "torch"
        self.kernel = "auto"
        self.slot = {e: i for i, e in enumerate(packed["w13"].experts)}
        for p in PROJS:  # buffers: model.to(device) moves the codes, and decoding runs where they are
            self.register_buffer(f"{p}_codebooks", packed[p].codebooks)
            self.register_buffer(f"{p}_indices", packed[p].indices)
            self.register_buffer(f"{p}_scales", packed[p].scales)
            self.register_buffer(f"{p}_global", packed[p].global_scale)
        for e, (w13, w2) in dense.items():
            self.register_buffer(f"dense_{e}_w13", w13)
            self.register_buffer(f"dense_{e}_w2", w2)

    def decoded(self, e: int, projection: str) -> torch.Tensor:
        """float32 weight of cold expert e's projection, decoded from its codes (quant.format's decoder)."""
        s = self.slot[e]
        books = fp4_decode(getattr(self, f"{projection}_codebooks")[s])
        return decode_parts(books, getattr(self, f"{projection}_indices")[s], getattr(self, f"{projection}_scales")[s],
                            getattr(self, f"{projection}_global"))

    def codes(self, e: int, projection: str) -> tuple[torch.Tensor, ...]:
        """(codebooks, indices, scales, global) of cold expert e's projection: what quant.rvq_triton reads."""
        s = self.slot[e]
        return tuple(getattr(self, f"{projection}_{n}")[s] for n in ("codebooks", "indices", "scales")) + \
            (getattr(self, f"{projection}_global"),)

    def _cold(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Cold expert e on rows x through the Triton kernels (float32 inside)."""
        from quant import rvq_triton
        g, u = rvq_triton.linear(x, *self.codes(e, "w13")).chunk(2, dim=-1)
        return rvq_triton.linear(self.act_fn(g) * u, *self.codes(e, "w2")).to(x.dtype)

    def weights(self, e: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13, w2) of expert e: a dense expert's tensors or a cold expert decoded from its codes."""
        if e in self.slot:
            return tuple(self.decoded(e, p).to(dtype) for p in PROJS)
        return getattr(self, f"dense_{e}_w13"), getattr(self, f"dense_{e}_w2")

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(hidden_states)
        for e in torch.unique(top_k_index).tolist():
            if not 0 <= e < self.num_experts:
                continue
            hit = top_k_index == e
            rows = torch.nonzero(hit.any(dim=1)).flatten()
            gate = (top_k_weights * hit).sum(dim=1)[rows]
            triton = self.kernel == "triton" or (self.kernel == "auto" and hidden_states.is_cuda)
            if e in self.slot and triton:
                y = self._cold(e, hidden_states[rows])
            else:
                w13, w2 = self.weights(e, hidden_states.dtype)
                g, u = nn.functional.linear(hidden_states[rows], w13).chunk(2, dim=-1)
                y = nn.functional.linear(self.act_fn(g) * u, w2)
            y = y * gate[:, None].to(hidden_states.dtype)
            out.index_add_(0, rows, y)
        return out


def published_layers(arvq: str | Path, ck: Checkpoint) -> dict[int, dict[str, RVQProjection]]:
    """Every layer of an ARVQ output, digests verified, after checking it was published from checkpoint ck."""
    files = ck.files
    arvq = Path(arvq)
    manifest = store.read_manifest(arvq)
    if not manifest["layers"]:
        raise FormatError(f"{arvq / store.MANIFEST}: no published layer (run `quant run` first)")
    out = {}
    for key, rec in sorted(manifest["layers"].items(), key=lambda kv: int(kv[0])):
        recorded = rec["meta"].get("donor_files") or {}
        if not recorded:
            raise FormatError(f"{arvq / store.MANIFEST}: layer {key} records no Hugging Face checkpoint files")
        for name in sorted(set(recorded) | set(files)):
            if recorded.get(name) != files.get(name):
                raise IntegrityError(ck.path / name, f"blake3 {recorded.get(name)} (as published in {arvq})",
                                     f"blake3 {files.get(name)}", "the checkpoint differs from the one quantized")
        out[int(key)] = store.load_layer(arvq, int(key))
    return out


def replace_experts(model, layers: dict[int, dict[str, RVQProjection]]) -> None:
    """Put an ArvqExperts in place of each listed layer's experts module (the hot experts copied dense)."""
    for layer, packed in layers.items():
        old = model.model.layers[layer].mlp.experts
        cold = set(packed["w13"].experts)
        dense = {e: (old.gate_up_proj[e].detach().clone(), old.down_proj[e].detach().clone())
                 for e in range(old.num_experts) if e not in cold}
        model.model.layers[layer].mlp.experts = ArvqExperts(dense, packed, old.num_experts, old.act_fn)


def load_quantized(checkpoint: str | Path, arvq: str | Path):
    """The checkpoint's transformers model (float32, eval) with the published ARVQ experts in place."""
    ck = open_checkpoint(checkpoint)
    layers = published_layers(arvq, ck)     # everything verified before the model is touched
    model = load_model(ck)
    replace_experts(model, layers)
    return model


def with_expert_weights(model, weights: dict[int, dict[int, dict[str, torch.Tensor]]]):
    """The model with the given experts' weights written into its fused experts (baselines, comparisons)."""
    with torch.no_grad():
        for layer, experts in weights.items():
            mod = model.model.layers[layer].mlp.experts
            for e, w in experts.items():
                mod.gate_up_proj[e].copy_(w["w13"])
                mod.down_proj[e].copy_(w["w2"])
    return model


@torch.no_grad()
def heldout_ce(model, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over windows [W, T] (every window weighs the same)."""
    total = 0.0
    for i in range(0, windows.shape[0], batch):
        chunk = windows[i:i + batch]
        total += float(model(input_ids=chunk, labels=chunk).loss) * chunk.shape[0]
    return total / windows.shape[0]
