"""training/deferred_hash.py on the CPU: a state hash queued at a step's end is that state's, even when the tensors are
written in place before it is read (the trainer reads it after the next step has run)."""
import torch

from training.deferred_hash import StateHashReader, queue_state_hash
from training.state_hash import state_hash


def _entries(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {"param/w": torch.randn(300, 257, generator=g).to(torch.bfloat16), "m/w": torch.randn(300, 257, generator=g),
            "meta/counters": b'{"step":3}'}


def test_a_queued_hash_is_the_state_at_queue_time():
    entries = _entries(0)
    want = state_hash(dict(entries))
    queued = queue_state_hash(entries)
    entries["m/w"].mul_(2)  # the next step's in-place writes
    entries["param/w"].add_(1)
    assert StateHashReader().read(queued) == want
    assert state_hash(entries) != want  # the writes did change the state


def test_a_queued_hash_equals_state_hash():
    for seed in (1, 2):
        entries = _entries(seed)
        assert StateHashReader().read(queue_state_hash(dict(entries))) == state_hash(entries)
