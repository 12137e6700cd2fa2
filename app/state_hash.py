"""The state hash and the hash chain: blake3 over a canonical serialization of the complete training state.

Serialization (format `open-1b-state/1`), one entry per name, entries sorted by their UTF-8 name bytes:
    u32 len(name) | name | u8 kind                                    (kind 0: tensor, 1: bytes)
    tensor: u32 len(dtype) | dtype (e.g. "bfloat16") | u32 ndim | u64 dim... | u64 nbytes | bytes
    bytes:  u64 len | bytes
All integers little-endian; tensor bytes are the elements in C order, little-endian (kernels.digest).
Entries: `param/<name>` (bf16 masters, float32 activation steps), `m/<name>`, `v/<name>` (float32 Adam
moments), `grad/<name>` (the step's post-clip float32 gradients), and `meta/code_version`, `meta/config`
(canonical JSON), `meta/counters` ({"adam_step", "step", "tokens"}), `meta/spike` (the spike protocol),
`meta/stream` (the stream state at the next step's first window, canonical JSON).
    state_t = blake3(b"open-1b-state/1" | entries)
    chain_t = blake3(chain_{t-1} | state_t)        (raw 32-byte digests; chain_{-1} = 32 zero bytes)
The chain of the initial state (step -1: init params, zero moments and grads) anchors every run.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import blake3
import torch

from app.digests import le_array
from app.step import TrainState

FORMAT = b"open-1b-state/1"
ZERO = bytes(32)
# the files whose text defines the bits of a run (kernels, stream, and the app's bit path)
CODE_GLOBS = ("kernels/ref/*.py", "kernels/digest.py", "stream/*.py", "collectives/treefold.py", "app/config.py", "app/digests.py", "app/params.py",
              "app/model.py", "app/moe.py", "app/init.py", "app/reduction.py", "app/optim.py", "app/step.py",
              "app/state_hash.py")
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


def _tensor_entry(h, name: str, t: torch.Tensor) -> None:
    nb = name.encode()
    dt = str(t.dtype).removeprefix("torch.").encode()
    head = struct.pack("<I", len(nb)) + nb + b"\0" + struct.pack("<I", len(dt)) + dt + struct.pack("<I", t.dim())
    head += b"".join(struct.pack("<Q", int(s)) for s in t.shape)
    arr = le_array(t)
    h.update(head + struct.pack("<Q", arr.nbytes))
    h.update(memoryview(arr).cast("B") if arr.nbytes else b"")


def _bytes_entry(h, name: str, data: bytes) -> None:
    nb = name.encode()
    h.update(struct.pack("<I", len(nb)) + nb + b"\1" + struct.pack("<Q", len(data)) + data)


def state_entries(state: TrainState, config_json: str, code: str, stream_state: dict) -> dict[str, object]:
    """name -> tensor or bytes: the complete state the hash covers."""
    out: dict[str, object] = {}
    for prefix, d in (("param", state.params), ("m", state.m), ("v", state.v), ("grad", state.grads)):
        for k, t in d.items():
            out[f"{prefix}/{k}"] = t
    out["meta/code_version"] = code.encode()
    out["meta/config"] = config_json.encode()
    out["meta/counters"] = canonical_json({"adam_step": state.adam_step, "step": state.step, "tokens": state.tokens})
    out["meta/spike"] = canonical_json(state.spike.as_dict())
    out["meta/stream"] = canonical_json(stream_state)
    return out


def state_hash(entries: dict[str, object]) -> bytes:
    """blake3 (raw 32 bytes) of the canonical serialization of `entries` (module doc)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)  # the digest does not depend on the thread count
    h.update(FORMAT)
    for name in sorted(entries, key=lambda s: s.encode()):
        v = entries[name]
        if isinstance(v, torch.Tensor):
            _tensor_entry(h, name, v)
        else:
            _bytes_entry(h, name, v)
    return h.digest()


def chain(prev: bytes, state: bytes) -> bytes:
    """chain_t = blake3(chain_{t-1} | state_t), raw digests."""
    if len(prev) != 32 or len(state) != 32:
        raise ValueError("chain: digests must be 32 raw bytes")
    return blake3.blake3(prev + state).digest()
