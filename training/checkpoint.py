"""Pickle-free checkpoints: safetensors files plus a JSON manifest with each file's blake3.

Layout: <run>/checkpoints/step-<12 digits>/ (the state after that many steps) holding
    params.safetensors  masters (bf16; float32 activation steps)
    optim.safetensors   m/<name>, v/<name> (float32)
    grads.safetensors   the last step's post-clip gradients (float32; part of the hashed state)
    manifest.json       schema, config, code version, counters, spike state, stream state, per-file
                        blake3, state hash and chain hash
Written into a temporary directory, fsynced, renamed into place (atomic): a crash leaves either the whole
checkpoint or none. Loading reads only JSON and safetensors, checks that every file is what the manifest
lists (anything else, pickles included, is refused), verifies every digest before parsing a tensor, and
recomputes the state hash from what it loaded: a checkpoint that does not hash to its manifest is refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import blake3
import torch
from safetensors.torch import load_file, save_file

from stream.fileio import atomic_directory, check_safetensors_header
from training.config import identity_json
from training.errors import CheckpointError, IntegrityError
from training.optim import SpikeState
from training.params import ParamSpec
from training.rundir import ckpt_dir
from training.state_hash import state_entries, state_hash
from training.step import TrainState

SCHEMA = "open-1b-checkpoint/1"
FILES = ("params.safetensors", "optim.safetensors", "grads.safetensors")
MANIFEST = "manifest.json"
_PICKLE_MAGIC = (b"\x80", b"PK\x03\x04")  # pickle protocol >= 2; torch.save's zip container


def file_digest(path: Path) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if path.stat().st_size:
        h.update_mmap(path)
    return h.hexdigest()


def save_checkpoint(run_dir: str | Path, state: TrainState, config: dict, code: str, stream_state: dict,
                    state_digest: str, chain_digest: str) -> Path:
    """Write the checkpoint of `state` (after `state.step` steps) atomically; refuses to overwrite one."""
    final = ckpt_dir(run_dir, state.step)
    if final.exists():
        raise CheckpointError(f"{final}: a checkpoint for step {state.step} exists; refusing to overwrite it")
    groups = {"params.safetensors": state.params,
              "optim.safetensors": {**{f"m/{k}": t for k, t in state.m.items()},
                                    **{f"v/{k}": t for k, t in state.v.items()}},
              "grads.safetensors": state.grads}
    with atomic_directory(final) as tmp:  # a crash leaves the whole checkpoint or none
        digests = {}
        for name, tensors in groups.items():
            save_file({k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}, str(tmp / name))
            digests[name] = file_digest(tmp / name)
        manifest = {"schema": SCHEMA, "step": state.step, "tokens": state.tokens, "adam_step": state.adam_step,
                    "spike": state.spike.as_dict(), "config": config, "code_version": code,
                    "stream_state": stream_state, "files": digests, "state_hash": state_digest,
                    "chain_hash": chain_digest}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return final


def _check_safetensors(path: Path) -> None:
    """Refuse anything that is not a safetensors file (a pickle in particular), or whose header does not fit its
    bytes, before any parser sees it; and a symbolic link (a checkpoint's files are its own)."""
    _refuse_symlink(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
    if any(head.startswith(m) for m in _PICKLE_MAGIC):
        raise CheckpointError(f"{path}: is a pickle payload; refused (checkpoints load safetensors only)")
    try:
        check_safetensors_header(path)
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _refuse_symlink(path: Path) -> None:
    if path.is_symlink():
        raise CheckpointError(f"{path}: is a symbolic link; refused (a checkpoint's files must be its own)")


def read_manifest(path: Path) -> dict:
    """The manifest of checkpoint directory `path`, schema-checked (JSON only)."""
    mpath = path / MANIFEST
    _refuse_symlink(mpath)
    if not mpath.is_file():
        raise CheckpointError(f"{mpath}: missing; not a checkpoint directory")
    try:
        manifest = json.loads(mpath.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{mpath}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != SCHEMA:
        raise CheckpointError(f"{mpath}: schema {manifest.get('schema') if isinstance(manifest, dict) else None!r}, "
                              f"expected {SCHEMA!r}")
    return manifest


def verify_files(path: Path, manifest: dict) -> None:
    """Exactly the listed safetensors files, each matching its blake3: else IntegrityError/CheckpointError."""
    files = manifest.get("files")
    if not isinstance(files, dict) or sorted(files) != sorted(FILES):
        raise CheckpointError(f"{path / MANIFEST}: lists files {sorted(files) if isinstance(files, dict) else files}, "
                              f"expected {sorted(FILES)}")
    present = sorted(p.name for p in path.iterdir())
    extra = [n for n in present if n not in FILES and n != MANIFEST]
    if extra:
        raise CheckpointError(f"{path}: unexpected file(s) {extra}; a checkpoint holds only {list(FILES)} and "
                              f"{MANIFEST} (nothing else is loaded, pickles never)")
    for name in FILES:
        fpath = path / name
        if not fpath.is_file():
            raise CheckpointError(f"{fpath}: listed in the manifest but missing")
        _check_safetensors(fpath)
        actual = file_digest(fpath)
        if actual != files[name]:
            raise IntegrityError(fpath, files[name], actual)


def _take(tensors: dict[str, torch.Tensor], key: str, spec: ParamSpec, dtype: torch.dtype, fname: str,
          device) -> torch.Tensor:
    if key not in tensors:
        raise CheckpointError(f"{fname}: tensor {key!r} is missing")
    t = tensors.pop(key)
    if tuple(t.shape) != spec.shape or t.dtype != dtype:
        raise CheckpointError(f"{fname}: tensor {key!r} is {t.dtype} {tuple(t.shape)}, expected {dtype} {spec.shape}")
    return t.to(device)


def load_checkpoint(path: str | Path, specs: dict[str, ParamSpec], code: str,
                    device: torch.device | str = "cpu") -> tuple[TrainState, dict]:
    """(state, manifest) from checkpoint directory `path`, every digest and the state hash verified first."""
    path = Path(path)
    manifest = read_manifest(path)
    verify_files(path, manifest)
    groups = {name: load_file(str(path / name)) for name in FILES}
    f32 = torch.float32
    params = {k: _take(groups["params.safetensors"], k, s, s.dtype, "params.safetensors", device)
              for k, s in specs.items()}
    m = {k: _take(groups["optim.safetensors"], f"m/{k}", s, f32, "optim.safetensors", device) for k, s in specs.items()}
    v = {k: _take(groups["optim.safetensors"], f"v/{k}", s, f32, "optim.safetensors", device) for k, s in specs.items()}
    grads = {k: _take(groups["grads.safetensors"], k, s, f32, "grads.safetensors", device) for k, s in specs.items()}
    for name, rest in groups.items():
        if rest:
            raise CheckpointError(f"{path / name}: unexpected tensor(s) {sorted(rest)[:5]}")
    try:
        spike = SpikeState(**manifest["spike"])
        state = TrainState(params, m, v, grads, int(manifest["adam_step"]), spike, int(manifest["step"]),
                           int(manifest["tokens"]))
        entries = state_entries(state, identity_json(manifest["config"]), manifest["code_version"],
                                manifest["stream_state"])
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path / MANIFEST}: malformed ({e})") from None
    actual = state_hash(entries).hex()
    if actual != manifest.get("state_hash"):
        raise IntegrityError(path / MANIFEST, str(manifest.get("state_hash")), actual,
                             "the loaded state does not hash to the manifest's state hash")
    if manifest["code_version"] != code:
        raise CheckpointError(f"{path / MANIFEST}: written by code version {manifest['code_version'][:16]}, this is "
                              f"{code[:16]}; the chain would not continue the same computation")
    return state, manifest
