"""The state hash, queued at a step's end and read later: the host goes on to the next step while the GPU hashes.

`queue_state_hash(entries, memo)` starts the digests of the entries' tensors on their device (kernels.digest). On
CUDA they run on a stream of their own, behind the step's work, beside the next step's forward and backward, which
only read the state: `queued.fence()`, called by the next step before its first write to the state (run_step's
`before_update`), makes the step's stream wait for them, so they are the end state's digests whenever they are
read. The memo holds the hashed tensors until the read, so their memory is not handed to the next step meanwhile.
`StateHashReader().read(queued)` returns training.state_hash's value for those entries. It calls `state_hash`
itself, so this module defines no bits: it only chooses where the digests run and when the host waits (and is not
among the code version's files).
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
    ready: torch.cuda.Event | None  # recorded after them on the hash stream; None on the CPU (hashed when queued)

    def fence(self) -> None:
        """The current stream waits for the digests: call before writing any of the hashed tensors."""
        if self.ready is not None:
            torch.cuda.current_stream(self.ready_device).wait_event(self.ready)

    @property
    def ready_device(self) -> torch.device:
        return next(v.device for v in self.entries.values() if isinstance(v, torch.Tensor) and v.is_cuda)


_HASH_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _hash_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _HASH_STREAMS:
        _HASH_STREAMS[device] = torch.cuda.Stream(device)
    return _HASH_STREAMS[device]


def queue_state_hash(entries: dict[str, object], memo: DigestMemo | None = None) -> QueuedHash:
    """Queue the digests of every tensor in `entries` (the memo may already hold some, from the step)."""
    memo = memo or DigestMemo()
    tensors = [v for v in entries.values() if isinstance(v, torch.Tensor)]
    cuda = next((t.device for t in tensors if t.is_cuda), None)
    if cuda is None:
        memo.queue(tensors)
        return QueuedHash(entries, memo, None)
    side = _hash_stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))  # behind the step's writes
    with torch.cuda.stream(side):
        memo.queue(tensors)
        ready = torch.cuda.Event()
        ready.record(side)
    return QueuedHash(entries, memo, ready)


class StateHashReader:
    """Reads queued state hashes. state_hash reads the digests with a blocking copy: on the step's stream it would
    wait behind every kernel queued since (the next step's), on a side stream it waits only for the digests."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def read(self, q: QueuedHash) -> bytes:
        if q.ready is None:
            return state_hash(q.entries, q.memo)
        device = q.ready_device
        side = self._streams.get(device) or self._streams.setdefault(device, torch.cuda.Stream(device))
        side.wait_event(q.ready)
        with torch.cuda.stream(side):
            return state_hash(q.entries, q.memo)
