"""The project's trained MoE as ARVQ's donor: parameters from a run's checkpoint, its expert load, and the
MoE block split into the parts the PV objective needs (the ARVQ write-up, sections 4-5).

    a      = h + attention(RMSNorm(h))                     # training.model.attention_block, unchanged
    f      = RMSNorm(a)                                    # the MoE input
    block  = a + shared(f) + sum_slot gate * expert(f)     # training.moe.moe_ffn: the donor's block output
    frozen = a + shared(f) + sum_{hot e} gate_e * expert_e(f)   # everything that is not a cold expert

Every op is app's (kernels/ref), so the donor parts are the same bits on every machine. Checkpoints are
read through training.checkpoint's digest check (safetensors only, nothing unpickled).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from training.checkpoint import read_manifest, verify_files
from training.rundir import ckpt_dir, list_checkpoints
from stream.fileio import check_safetensors_header
from training.config import RunConfig, from_dict
from training.layers import ffn
from training.model import attention_block, rope_for
from training.moe import moe_ffn, top_k
from kernels.ref.contraction import hp_matmul
from kernels.ref.embedding import embedding
from kernels.ref.rmsnorm import rmsnorm
from kernels.ref.softmax import softmax
from quant.calib import SEPARATOR, CalibConfig, build as build_calib
from quant.errors import ConfigError, FormatError
from quant.objective import routed_rows

F32 = torch.float32


@dataclass
class Donor:
    """A trained MoE: config, float32 parameters, RoPE tables, and where they came from."""
    cfg: RunConfig
    params: dict[str, torch.Tensor]
    source: str
    step: int
    run: str | None = None  # the run directory: its hash log holds the expert load

    @property
    def n_experts(self) -> int:
        return self.cfg.model.moe.n_experts

    @property
    def n_layers(self) -> int:
        return self.cfg.model.n_layers

    @property
    def separator(self) -> int:
        return SEPARATOR

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return embed(self, ids)

    def block(self, layer: int, h: torch.Tensor, rope) -> torch.Tensor:
        return donor_block(self, layer, h, rope)

    def block_parts(self, layer: int, h: torch.Tensor, cold: list[int], rope) -> "BlockParts":
        return block_parts(self, layer, h, cold, rope)

    def act_steps(self, layer: int, experts: list[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Each expert's learned activation steps (w_gate_up, w_down): the int8 linears' s_x."""
        pre = f"layers.{layer}.moe.experts"
        return {e: (self.params[f"{pre}.{e}.w_gate_up.s_x"], self.params[f"{pre}.{e}.w_down.s_x"]) for e in experts}

    def calibration(self, cfg: CalibConfig) -> dict:
        """The calibration windows from the run's own corpus and window length, purged of its held-out CE set."""
        from dataclasses import replace
        from training.evaluate import heldout_tokens
        cfg = replace(cfg, corpus=self.cfg.train.corpus, seq_len=self.cfg.model.seq_len)
        return build_calib(cfg, extra_held_out=heldout_tokens(self.cfg))

    def routing_load(self, data: dict) -> dict[int, list[int]]:
        """The run's own routing statistics: its hash log's expert_load (the calibration data is not needed)."""
        if self.run is None:
            raise ConfigError(f"donor {self.source}: no run directory, so no expert load; pass the cold experts")
        return expert_load(self.run)

    def rope(self) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_for(self.cfg.model, "cpu")

    def expert_weights(self, layer: int, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [2F, D] as [gate; up], w2 [D, F]) of one routed expert, float32."""
        pre = f"layers.{layer}.moe.experts.{expert}"
        return self.params[f"{pre}.w_gate_up.weight"], self.params[f"{pre}.w_down.weight"]


def load_donor(run: str | Path, step: int | None = None) -> Donor:
    """The donor from run directory `run` (its latest checkpoint unless `step`), every file digest checked."""
    run = Path(run)
    steps = list_checkpoints(run)
    if not steps:
        raise ConfigError(f"--model {run}: no checkpoints in {run / 'checkpoints'} (train one with "
                          f"`python -m app train --config tiny-moe ...`)")
    step = steps[-1] if step is None else step
    path = ckpt_dir(run, step)
    manifest = read_manifest(path)
    verify_files(path, manifest)  # blake3 of every file before a byte is parsed
    cfg = from_dict(manifest["config"])
    if cfg.model.moe is None:
        raise ConfigError(f"--model {run}: config {cfg.name!r} has no MoE layers; ARVQ needs routed experts")
    try:
        check_safetensors_header(path / "params.safetensors")
    except ValueError as exc:
        raise FormatError(f"{path / 'params.safetensors'}: {exc}") from None
    params = {k: v.to(F32) for k, v in load_file(str(path / "params.safetensors")).items()}
    return Donor(cfg, params, str(path), step, str(run))


def expert_load(run: str | Path) -> dict[int, list[int]]:
    """Tokens routed to each expert per layer, summed over every step of the run's hash log."""
    total: dict[int, list[int]] = {}
    path = Path(run) / "hashlog.jsonl"
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        for name, counts in rec.get("expert_load", {}).items():
            layer = int(name.split(".")[1])
            cur = total.setdefault(layer, [0] * len(counts))
            total[layer] = [a + b for a, b in zip(cur, counts)]
    if not total:
        raise ConfigError(f"{path}: no expert_load records; is this an MoE run?")
    return total


def cold_from_load(load: dict[int, list[int]], hot_per_layer: int) -> dict[int, list[int]]:
    """Per layer, every expert except the `hot_per_layer` most loaded (ties: lower id stays hot)."""
    out = {}
    for layer, counts in load.items():
        if not 0 <= hot_per_layer < len(counts):
            raise ConfigError(f"--hot-per-layer must be in [0, {len(counts)}), got {hot_per_layer}")
        hot = sorted(range(len(counts)), key=lambda e: (-counts[e], e))[:hot_per_layer]
        out[layer] = [e for e in range(len(counts)) if e not in hot]
    return out


def embed(d: Donor, ids: torch.Tensor) -> torch.Tensor:
    """The residual stream entering layer 0 for input ids [B, T]."""
    p, m = d.params, d.cfg.model
    return rmsnorm(embedding(ids, p["embed.weight"]), p["embed_norm.weight"], m.norm_eps)


@dataclass
class BlockParts:
    """One layer's MoE block on one input: the pieces the objective combines (rows = B*T tokens)."""
    f: torch.Tensor        # [N, D] MoE input (normalized)
    topk: torch.Tensor     # int64 [N, k] routed experts
    gates: torch.Tensor    # [N, k] their gate values
    frozen: torch.Tensor   # [N, D] a + shared + hot experts' routed sum


@torch.no_grad()
def block_parts(d: Donor, layer: int, h: torch.Tensor, cold: list[int], rope) -> BlockParts:
    """The block on residual input h [B, T, D]: MoE input, routing, and the frozen (non-cold) output."""
    p, m = d.params, d.cfg.model
    pre = f"layers.{layer}"
    a = h + attention_block(p, m, layer, rmsnorm(h, p[f"{pre}.attn_norm.weight"], m.norm_eps), rope)
    f3 = rmsnorm(a, p[f"{pre}.ffn_norm.weight"], m.norm_eps)
    n, dim = h.shape[0] * h.shape[1], h.shape[2]
    f = f3.reshape(n, dim)
    logits = hp_matmul(f, p[f"{pre}.moe.router.weight"].t())
    idx = top_k(logits, m.moe.top_k)
    gates = softmax(logits.gather(1, idx), -1)
    frozen = a.reshape(n, dim)
    if m.moe.shared_ffn:
        frozen = frozen + ffn(p, f"{pre}.moe.shared", f)
    for e in range(m.moe.n_experts):  # hot experts, ascending id: one fixed order
        if e in cold:
            continue
        rows, g = routed_rows(idx, gates, e)
        if len(rows):
            y = ffn(p, f"{pre}.moe.experts.{e}", f[rows]) * g[:, None]
            frozen = frozen.index_add(0, rows, y)  # rows are distinct: no duplicate-index sums
    return BlockParts(f, idx, gates, frozen)


@torch.no_grad()
def donor_block(d: Donor, layer: int, h: torch.Tensor, rope) -> torch.Tensor:
    """The donor's whole block output [B, T, D] (residual included) on h: app's own MoE forward."""
    p, m = d.params, d.cfg.model
    pre = f"layers.{layer}"
    a = h + attention_block(p, m, layer, rmsnorm(h, p[f"{pre}.attn_norm.weight"], m.norm_eps), rope)
    y, _, _ = moe_ffn(p, m, f"{pre}.moe", rmsnorm(a, p[f"{pre}.ffn_norm.weight"], m.norm_eps))
    return a + y
