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
On CUDA the same bytes are laid out in one device buffer and hashed there (kernels/triton/statehash.py):
the digest is identical, and only 32 bytes reach the host.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import blake3
import torch

from app.digests import gpu_hasher, le_array
from app.step import TrainState

FORMAT = b"open-1b-state/1"
ZERO = bytes(32)
# the files whose text defines the bits of a run (kernels, stream, and the app's bit path)
CODE_GLOBS = ("kernels/ref/*.py", "kernels/digest.py", "stream/*.py", "collectives/treefold.py", "app/config.py", "app/digests.py", "app/params.py",
              "app/model.py", "app/moe.py", "app/init.py", "app/reduction.py", "app/optim.py", "app/step.py",
              "app/sharding.py", "app/state_hash.py")
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
    """An entry's bytes before the tensor's: name, kind 0, dtype, shape, byte count."""
    nb = name.encode()
    dt = str(t.dtype).removeprefix("torch.").encode()
    head = struct.pack("<I", len(nb)) + nb + b"\0" + struct.pack("<I", len(dt)) + dt + struct.pack("<I", t.dim())
    head += b"".join(struct.pack("<Q", int(s)) for s in t.shape)
    return head + struct.pack("<Q", t.numel() * t.element_size())


def _bytes_head(name: str, data: bytes) -> bytes:
    nb = name.encode()
    return struct.pack("<I", len(nb)) + nb + b"\1" + struct.pack("<Q", len(data))


def _pieces(entries: dict[str, object]) -> list:
    """The serialization (module doc) as a list of host bytes and tensors, in order."""
    out: list = [FORMAT]
    for name in sorted(entries, key=lambda s: s.encode()):
        v = entries[name]
        if isinstance(v, torch.Tensor):
            out += [_tensor_head(name, v), v]
        else:
            out += [_bytes_head(name, v) + v]
    return out


def state_entries(state: TrainState, config_json: str, code: str, stream_state: dict) -> dict[str, object]:
    """name -> tensor or bytes: the complete state the hash covers."""
    if state.shard is not None:
        raise ValueError(f"state hash of step {state.step}: this rank holds only slice [{state.shard.lo}, "
                         f"{state.shard.hi}) of m, v and grads (HSDP); rank 0 holds and hashes the full state")
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


def _host_hash(pieces: list) -> bytes:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)  # the digest does not depend on the thread count
    for p in pieces:
        if isinstance(p, torch.Tensor):
            arr = le_array(p)
            if arr.nbytes:
                h.update(memoryview(arr).cast("B"))
        else:
            h.update(p)
    return h.digest()


def _device_hash(pieces: list, gpu) -> bytes:
    """The same bytes laid out in one device buffer (tensors copied device-to-device), hashed on the GPU."""
    device = next(p.device for p in pieces if isinstance(p, torch.Tensor))
    host = b"".join(p for p in pieces if not isinstance(p, torch.Tensor))
    host_dev = torch.frombuffer(bytearray(host), dtype=torch.uint8).to(device)
    sizes = [p.numel() * p.element_size() if isinstance(p, torch.Tensor) else len(p) for p in pieces]
    n = sum(sizes)
    buf = torch.zeros((n + 3) // 4 * 4, dtype=torch.uint8, device=device)
    at = hat = 0
    for p, size in zip(pieces, sizes):
        if isinstance(p, torch.Tensor):
            if p.device != device:
                raise ValueError(f"state_hash: tensors on {device} and {p.device}; hash one device's state")
            buf[at:at + size] = p.detach().contiguous().reshape(-1).view(torch.uint8)  # CUDA is little-endian
        else:
            buf[at:at + size] = host_dev[hat:hat + size]
            hat += size
        at += size
    return gpu.blake3_words(buf.view(torch.int32), n).cpu().numpy().astype("<i4").tobytes()


def state_hash(entries: dict[str, object]) -> bytes:
    """blake3 (raw 32 bytes) of the canonical serialization of `entries` (module doc), on the state's device."""
    pieces = _pieces(entries)
    first = next((p for p in pieces if isinstance(p, torch.Tensor)), None)
    gpu = gpu_hasher(first) if first is not None else None
    return _device_hash(pieces, gpu) if gpu is not None else _host_hash(pieces)


def chain(prev: bytes, state: bytes) -> bytes:
    """chain_t = blake3(chain_{t-1} | state_t), raw digests."""
    if len(prev) != 32 or len(state) != 32:
        raise ValueError("chain: digests must be 32 raw bytes")
    return blake3.blake3(prev + state).digest()
