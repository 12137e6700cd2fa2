"""training/deferred_hash.py on CUDA: the digests queued at a step's end run before the kernels queued after them (the
next step's in-place writes), and the side-stream read returns that state's hash."""
import pytest
import torch

from training.deferred_hash import StateHashReader, queue_state_hash
from training.state_hash import state_hash

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_queued_hash_is_the_state_at_queue_time():
    pytest.importorskip("triton")
    g = torch.Generator(device="cuda").manual_seed(7)
    entries = {"param/w": torch.randn(4099, 2048, generator=g, device="cuda").to(torch.bfloat16),
               "m/w": torch.randn(4099, 2048, generator=g, device="cuda"),
               "grad/w": torch.randn(1, 5, generator=g, device="cuda"), "meta/counters": b'{"step":3}'}
    want = state_hash(dict(entries))
    queued = queue_state_hash(entries)
    for _ in range(50):  # in-place writes queued behind the digests, long enough to still run at the read
        entries["m/w"].mul_(1.5)
    entries["param/w"].add_(1)
    assert StateHashReader().read(queued) == want
    torch.cuda.synchronize()
    assert state_hash(entries) != want  # the writes did change the state
