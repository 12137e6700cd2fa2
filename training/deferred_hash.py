"""The state hash, queued at a step's end and read later: the host goes on to the next step while the GPU hashes.

`queue_state_hash(entries, memo)` starts the digests of the entries' tensors on their device (kernels.digest),
ordered on the step's stream behind the step's work and ahead of the next step's writes to the same tensors,
so they are the end state's digests whenever they are read. `StateHashReader().read(queued)` returns
training.state_hash's value for those entries. It calls `state_hash` itself, so this module defines no bits: it only chooses when the
host waits (and is not among the code version's files).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.digest import DigestMemo
from training.state_hash import state_hash


@dataclass
class QueuedHash:
    entries: dict[str, object]  # training.state_hash.state_entries of the step's end state
    memo: DigestMemo  # holds the queued digests
    ready: torch.cuda.Event | None  # recorded after them on a CUDA stream; None on the CPU (hashed when queued)


def queue_state_hash(entries: dict[str, object], memo: DigestMemo | None = None) -> QueuedHash:
    """Queue the digests of every tensor in `entries` (the memo may already hold some, from the step)."""
    memo = memo or DigestMemo()
    tensors = [v for v in entries.values() if isinstance(v, torch.Tensor)]
    memo.queue(tensors)
    ready = None
    if any(t.is_cuda for t in tensors):
        ready = torch.cuda.Event()
        ready.record()
    return QueuedHash(entries, memo, ready)


class StateHashReader:
    """Reads queued state hashes. state_hash reads the digests with a blocking copy: on the step's stream it would
    wait behind every kernel queued since (the next step's), on a side stream it waits only for the digests."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def read(self, q: QueuedHash) -> bytes:
        if q.ready is None:
            return state_hash(q.entries, q.memo)
        device = next(v.device for v in q.entries.values() if isinstance(v, torch.Tensor) and v.is_cuda)
        side = self._streams.get(device) or self._streams.setdefault(device, torch.cuda.Stream(device))
        side.wait_event(q.ready)
        with torch.cuda.stream(side):
            return state_hash(q.entries, q.memo)
