"""A Hugging Face MoE checkpoint directory, checked before anything is loaded: which layout it is, that every
shard and every expert tensor is there, and the blake3 of each file (the published output records them).

    DIR/config.json                       model_type: mixtral | qwen2_moe | qwen3_moe
    DIR/model.safetensors.index.json      weight_map: tensor -> shard (or one DIR/model.safetensors)
    DIR/model-0000i-of-0000n.safetensors  the shards (safetensors only: nothing is unpickled)
    DIR/tokenizer.json                    the model's tokenizer (the calibration corpus is read with it)

Expert tensors on disk, per layer l and expert e (transformers fuses them into [E, 2F, D] / [E, D, F] on load):
    mixtral      model.layers.l.block_sparse_moe.experts.e.{w1 (gate), w3 (up), w2 (down)}.weight
    qwen*_moe    model.layers.l.mlp.experts.e.{gate_proj, up_proj, down_proj}.weight; qwen2_moe adds
                 mlp.shared_expert.{gate,up,down}_proj.weight and mlp.shared_expert_gate.weight
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from quant.errors import ConfigError, FormatError
from stream.fileio import blake3_file, check_safetensors_header, member

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass(frozen=True)
class Layout:
    """Where one architecture keeps its MoE block's parts, on disk and in the transformers module."""
    model_type: str
    block: str                      # the MoE block's name under model.layers.l (disk and module)
    experts_keys: tuple[str, ...]   # config keys that may hold the number of routed experts
    gate_up_down: tuple[str, str, str]
    shared: bool                    # a sigmoid-gated shared expert (mlp.shared_expert, mlp.shared_expert_gate)

    def expert_tensors(self, layer: int, expert: int) -> tuple[str, str, str]:
        pre = f"model.layers.{layer}.{self.block}.experts.{expert}"
        return tuple(f"{pre}.{n}.weight" for n in self.gate_up_down)

    def block_tensors(self, layer: int) -> list[str]:
        pre = f"model.layers.{layer}.{self.block}"
        out = [f"{pre}.gate.weight"]
        if self.shared:
            out += [f"{pre}.shared_expert.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
            out.append(f"{pre}.shared_expert_gate.weight")
        return out


LAYOUTS = {
    "mixtral": Layout("mixtral", "block_sparse_moe", ("num_local_experts",), ("w1", "w3", "w2"), False),
    # transformers 5 writes num_local_experts for Qwen3-MoE; the published Qwen configs say num_experts
    "qwen2_moe": Layout("qwen2_moe", "mlp", ("num_experts", "num_local_experts"), ("gate_proj", "up_proj", "down_proj"),
                        True),
    "qwen3_moe": Layout("qwen3_moe", "mlp", ("num_experts", "num_local_experts"), ("gate_proj", "up_proj", "down_proj"),
                        False),
}


@dataclass(frozen=True)
class Checkpoint:
    """A checked checkpoint directory: its config, layout, tensor -> shard map and file digests."""
    path: Path
    config: dict
    layout: Layout
    weight_map: dict[str, str]
    files: dict[str, str]           # file name -> blake3, sorted by name

    @property
    def n_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def n_experts(self) -> int:
        return int(next(self.config[k] for k in self.layout.experts_keys if k in self.config))

    def tensor(self, name: str) -> torch.Tensor:
        """One tensor, float32, read from its shard (the file's own bits, before any transformers conversion)."""
        with safe_open(str(self.path / self.weight_map[name]), framework="pt") as f:
            return f.get_tensor(name).to(torch.float32)


def _json(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FormatError(f"{path}: missing ({what})") from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}: not valid JSON: {exc}") from None


def _moe_layers_only(path: Path, cfg: dict) -> None:
    """Every layer must be an MoE layer: dense layers in between (mlp_only_layers, a sparse step) are not supported."""
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1)) != 1 \
            or int(cfg.get("first_k_dense_replace", 0)) != 0:
        raise ConfigError(f"{path / 'config.json'}: dense layers between the MoE layers (mlp_only_layers / "
                          f"decoder_sparse_step / first_k_dense_replace) are not a supported layout")


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Check DIR as module doc says; every error names the file or tensor. Nothing is loaded but headers."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"--model {path}: not a directory (a Hugging Face checkpoint directory is expected)")
    cfg = _json(path / "config.json", "the model's config")
    layout = LAYOUTS.get(cfg.get("model_type"))
    if layout is None:
        raise ConfigError(f"{path / 'config.json'}: model_type {cfg.get('model_type')!r} is not a supported MoE "
                          f"layout (supported: {', '.join(sorted(LAYOUTS))})")
    _moe_layers_only(path, cfg)
    for key in ("num_hidden_layers", "hidden_size"):
        if not isinstance(cfg.get(key), int):
            raise FormatError(f"{path / 'config.json'}: {key} missing")
    if not any(isinstance(cfg.get(k), int) for k in layout.experts_keys):
        raise FormatError(f"{path / 'config.json'}: the number of experts ({' or '.join(layout.experts_keys)}) missing")
    if (path / INDEX).exists():
        weight_map = _json(path / INDEX, "the shard index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise FormatError(f"{path / INDEX}: no weight_map")
    elif (path / SINGLE).exists():
        weight_map = None
    else:
        raise FormatError(f"{path}: neither {INDEX} nor {SINGLE}")
    if not (path / "tokenizer.json").exists():
        raise FormatError(f"{path / 'tokenizer.json'}: missing (the calibration corpus is read with it)")
    shards = sorted(set(weight_map.values())) if weight_map else [SINGLE]
    names: dict[str, str] = {}
    for shard in shards:
        try:
            p = member(path, shard)
        except ValueError as exc:
            raise FormatError(f"{path / INDEX}: shard {exc}") from None
        if not p.exists():
            raise FormatError(f"{p}: missing shard (listed in {INDEX})")
        try:
            check_safetensors_header(p)
            with safe_open(str(p), framework="pt") as f:
                names.update({k: shard for k in f.keys()})
        except Exception as exc:  # safetensors raises its own types; name the shard
            raise FormatError(f"{p}: not a readable safetensors shard: {exc}") from None
    for name, shard in (weight_map or {}).items():
        if names.get(name) != shard:
            raise FormatError(f"{path / shard}: tensor {name} listed in {INDEX} is not in this shard")
    ck = Checkpoint(path, cfg, layout, names, {})
    for layer in range(ck.n_layers):
        want = layout.block_tensors(layer) + [t for e in range(ck.n_experts) for t in layout.expert_tensors(layer, e)]
        for t in want:
            if t not in names:
                raise FormatError(f"{path}: tensor {t} missing from every shard ({layout.model_type} layout)")
    files = ["config.json", "tokenizer.json"] + ([INDEX] if weight_map else []) + shards
    return Checkpoint(path, cfg, layout, names, {f: blake3_file(path / f) for f in sorted(files)})
