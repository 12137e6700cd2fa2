"""A Hugging Face MoE checkpoint as ARVQ's donor: the same interface as quant.donor.Donor (embed, block,
block_parts, expert weights, calibration, routing load), with the block forward through `transformers`.

    a      = h + self_attn(input_layernorm(h))              # the decoder layer's own modules
    f      = post_attention_layernorm(a)                    # the MoE input
    block  = decoder_layer(h)                               # transformers' forward: the reference
    frozen = a + [shared gate * shared(f)] + sum_{hot e} gate_e * expert_e(f)

The router is the model's own (mlp.gate: logits, top-k gate values, top-k ids). The hot experts run in the
model's experts module with the cold experts' gate values set to 0, so the frozen part is transformers'
arithmetic too. The cold experts' arithmetic in PV is the float SwiGLU in BR ops
(quant.student.expert_forward with no activation steps), so the tuned bits do not depend on the gang.
Loaded from local files only (`local_files_only`), after quant.hf_checkpoint has checked the directory.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from quant import calib
from quant.donor import BlockParts
from quant.errors import ConfigError
from quant.hf_checkpoint import Checkpoint, open_checkpoint

F32 = torch.float32


def load_model(ck: Checkpoint):
    """The transformers model of a checked checkpoint, float32, eval mode, from local files only."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(ck.path), local_files_only=True, dtype=F32)
    return model.eval()


def separator_id(ck: Checkpoint) -> int:
    """The id joining calibration documents: the model's end-of-text token (config eos_token_id)."""
    eos = ck.config.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if not isinstance(eos, int):
        raise ConfigError(f"{ck.path / 'config.json'}: eos_token_id missing; the calibration joins documents with it")
    return eos


@dataclass
class HFDonor:
    """A transformers MoE model and its checked checkpoint."""
    ck: Checkpoint
    model: object
    step: int = 0
    _masks: dict = field(default_factory=dict)

    @property
    def source(self) -> str:
        return str(self.ck.path)

    @property
    def n_layers(self) -> int:
        return self.ck.n_layers

    @property
    def n_experts(self) -> int:
        return self.ck.n_experts

    @property
    def separator(self) -> int:
        return separator_id(self.ck)

    def rope(self) -> None:
        return None  # transformers computes its position embeddings itself (_context)

    def expert_weights(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2F, D] as [gate; up], w2 [D, F]) from the checkpoint's own tensors, float32."""
        g, u, d = (self.ck.tensor(t) for t in self.ck.layout.expert_tensors(layer, expert))
        return torch.cat([g, u]), d

    def act_steps(self, layer: int, experts: list[int]) -> dict[int, None]:
        return {e: None for e in experts}  # no activation quantization: the float SwiGLU expert

    def calibration(self, cfg: calib.CalibConfig) -> dict:
        """The calibration windows of cfg.corpus, tokenized with the checkpoint's tokenizer.json."""
        return calib.build(cfg, tokenizer=self.ck.path / "tokenizer.json", separator=self.separator)

    def _context(self, h: torch.Tensor) -> dict:
        """Causal mask and position embeddings for inputs [B, T, D], as the model's own forward builds them."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
        key = tuple(h.shape)
        if key not in self._masks:
            inner, cfg = self.model.model, self.model.config
            pos = torch.arange(h.shape[1]).unsqueeze(0)
            sliding = getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True)
            make = create_sliding_window_causal_mask if sliding else create_causal_mask
            mask = make(config=cfg, inputs_embeds=h, attention_mask=None, cache=None, position_ids=pos)
            self._masks = {key: {"attention_mask": mask, "position_ids": pos,
                                 "position_embeddings": inner.rotary_emb(h, position_ids=pos)}}
        return self._masks[key]

    @torch.no_grad()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.model.embed_tokens(ids).to(F32)

    @torch.no_grad()
    def block(self, layer: int, h: torch.Tensor, rope=None) -> torch.Tensor:
        """The donor's whole decoder layer on h [B, T, D]: transformers' forward."""
        return self.model.model.layers[layer](h, **self._context(h))

    @torch.no_grad()
    def block_parts(self, layer: int, h: torch.Tensor, cold: list[int], rope=None) -> BlockParts:
        mod = self.model.model.layers[layer]
        ctx = self._context(h)
        attn, _ = mod.self_attn(hidden_states=mod.input_layernorm(h), attention_mask=ctx["attention_mask"],
                                position_ids=ctx["position_ids"], position_embeddings=ctx["position_embeddings"])
        a = h + attn
        n, dim = h.shape[0] * h.shape[1], h.shape[2]
        f = mod.post_attention_layernorm(a).reshape(n, dim)
        mlp = mod.mlp
        _, gates, idx = mlp.gate(f)
        # cold slots get gate 0, not an id the module skips: its grouped_mm path has no such id; a
        # finite expert output times 0 adds nothing
        hot_gates = torch.where(torch.isin(idx, torch.tensor(cold, dtype=idx.dtype)), torch.zeros_like(gates), gates)
        frozen = a.reshape(n, dim) + mlp.experts(f, idx, hot_gates)
        if self.ck.layout.shared:
            frozen = frozen + torch.sigmoid(mlp.shared_expert_gate(f)) * mlp.shared_expert(f)
        return BlockParts(f, idx.to(torch.int64), gates.to(F32), frozen)

    @torch.no_grad()
    def routing_load(self, data: dict) -> dict[int, list[int]]:
        """Tokens routed to each expert per layer over the calibration training split (the donor trajectory)."""
        h = self.embed(data["train"][:, :-1])
        load = {}
        for layer in range(self.n_layers):
            idx = self.block_parts(layer, h, []).topk
            load[layer] = torch.bincount(idx.reshape(-1), minlength=self.n_experts).tolist()
            h = self.block(layer, h)
        return load


def load_hf_donor(path: str) -> HFDonor:
    """The donor from a checkpoint directory: checked (quant.hf_checkpoint), then loaded by transformers."""
    ck = open_checkpoint(path)
    return HFDonor(ck, load_model(ck))
