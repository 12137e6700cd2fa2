"""The state hash and the hash chain: blake3 over a canonical serialization of the complete training state.

Serialization (format `open-1b-state/2`), one entry per name, entries sorted by their UTF-8 name bytes:
    u32 len(name) | name | u8 kind                                    (kind 0: tensor, 1: bytes)
    tensor: u32 len(dtype) | dtype (e.g. "bfloat16") | u32 ndim | u64 dim... | u64 nbytes | blake3(bytes)
    bytes:  u64 len | bytes
All integers little-endian; a tensor's bytes are its elements in C order, little-endian (kernels.digest), and
enter through their 32-byte blake3 digest (kernels.digest.raw_digests): a two-level tree, so each tensor is hashed
where it lies (on the GPU, in parallel, no staging copy) and the digests the step's stage digests computed are
reused (DigestMemo) instead of hashing the same bytes twice.
Entries: `param/<name>` (bf16 masters, float32 activation steps), `m/<name>`, `v/<name>` (float32 Adam
moments), `grad/<name>` (the step's post-clip float32 gradients), and `meta/code_version`, `meta/config`
(canonical JSON, without `train.corpus`: the corpus enters by its manifest digest in `meta/stream`, so where it
lies changes no hash; training.config.identity_json), `meta/counters` ({"adam_step", "step", "tokens"}), `meta/spike` (the spike protocol),
`meta/stream` (the stream state at the next step's first window, canonical JSON).
    state_t = blake3(b"open-1b-state/2" | entries)
    chain_t = blake3(chain_{t-1} | state_t)        (raw 32-byte digests; chain_{-1} = 32 zero bytes)
The chain of the initial state (step -1: init params, zero moments and grads) anchors every run.
On CUDA the tensor digests are computed on the device (kernels/triton/statehash.py): the digest is identical,
and only 32 bytes per tensor reach the host.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import blake3
import torch

from kernels.digest import DigestMemo, tensor_head
from training.step import TrainState

FORMAT = b"open-1b-state/2"
ZERO = bytes(32)
# the files whose text defines the bits of a run (kernels, stream, and the app's bit path)
CODE_GLOBS = ("kernels/ref/*.py", "kernels/digest.py", "stream/*.py", "collectives/treefold.py",
              "collectives/allreduce.py", "collectives/schedule.py", "collectives/p2p.py", "collectives/limbs.py",
              "collectives/exact_wire.py", "collectives/wire_*.py", "collectives/wire_cpu.cpp",
              "collectives/exact_scatter.py", "training/config.py", "training/params.py",
              "training/layers.py", "training/model.py", "training/moe.py", "training/init.py",
              "training/reduction.py", "training/optim.py", "training/step.py", "training/sharding.py",
              "training/strategies.py", "training/windows.py", "collectives/average.py",
              "collectives/reduce_scatter.py", "training/state_hash.py")
ROOT = Path(__file__).resolve().parent.parent


def code_version() -> str:
    """blake3 over (relative path, bytes) of the bit-defining sources, sorted by path."""
    h = blake3.blake3()
    files = sorted({p for g in CODE_GLOBS for p in ROOT.glob(g)})
    for p in files:
        data = p.read_bytes()
        rel = p.relative_to(ROOT).as_posix().encode()
        h.update(struct.pack("<I", len(rel)) + rel + struct.pack("<Q", len(data)) + data)
    return h.hexdigest()


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _tensor_head(name: str, t: torch.Tensor) -> bytes:
    """An entry's bytes before the tensor's digest: name, kind 0, dtype, shape, byte count."""
    nb = name.encode()
    return struct.pack("<I", len(nb)) + nb + b"\0" + tensor_head(t) + struct.pack("<Q", t.numel() * t.element_size())


def _bytes_head(name: str, data: bytes) -> bytes:
    nb = name.encode()
    return struct.pack("<I", len(nb)) + nb + b"\1" + struct.pack("<Q", len(data))


def state_entries(state: TrainState, identity: str, code: str, stream_state: dict) -> dict[str, object]:
    """name -> tensor or bytes: the complete state the hash covers."""
    if state.shard is not None:
        raise ValueError(f"state hash of step {state.step}: this rank holds only slice [{state.shard.lo}, "
                         f"{state.shard.hi}) of m, v and grads (HSDP); rank 0 holds and hashes the full state")
    out: dict[str, object] = {}
    for prefix, d in (("param", state.params), ("m", state.m), ("v", state.v), ("grad", state.grads)):
        for k, t in d.items():
            out[f"{prefix}/{k}"] = t
    out["meta/code_version"] = code.encode()
    out["meta/config"] = identity.encode()
    out["meta/counters"] = canonical_json({"adam_step": state.adam_step, "step": state.step, "tokens": state.tokens})
    out["meta/spike"] = canonical_json(state.spike.as_dict())
    out["meta/stream"] = canonical_json(stream_state)
    return out


def state_hash(entries: dict[str, object], memo: DigestMemo | None = None) -> bytes:
    """blake3 (raw 32 bytes) of the canonical serialization of `entries` (module doc); tensor digests on the
    tensors' device, taken from `memo` where the step already computed them."""
    names = sorted(entries, key=lambda s: s.encode())
    tensors = [entries[k] for k in names if isinstance(entries[k], torch.Tensor)]
    memo = memo or DigestMemo()
    memo.queue(tensors)  # the device hashes while the host serializes the entries' heads (~2-3 ms on 976)
    heads = [_tensor_head(k, v) if isinstance(v, torch.Tensor) else _bytes_head(k, v) + v
             for k, v in ((k, entries[k]) for k in names)]
    digests = iter(memo.digests(tensors))
    h = blake3.blake3(FORMAT)
    for name, head in zip(names, heads):
        h.update(head + next(digests) if isinstance(entries[name], torch.Tensor) else head)
    return h.digest()


def chain(prev: bytes, state: bytes) -> bytes:
    """chain_t = blake3(chain_{t-1} | state_t), raw digests."""
    if len(prev) != 32 or len(state) != 32:
        raise ValueError("chain: digests must be 32 raw bytes")
    return blake3.blake3(prev + state).digest()
