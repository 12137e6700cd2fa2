"""training/deferred_hash.py on CUDA: the digests queued at a step's end run on their own stream, beside what the step's
stream queues next; the next step's in-place writes, queued after `fence()`, wait for them, and the side-stream read
returns that state's hash."""
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
    reads = entries["m/w"] * 3  # the next step's reads need not wait
    queued.fence()
    for _ in range(50):  # in-place writes queued behind the digests, long enough to still run at the read
        entries["m/w"].mul_(1.5)
    entries["param/w"].add_(1)
    assert StateHashReader().read(queued) == want
    torch.cuda.synchronize()
    assert state_hash(entries) != want  # the writes did change the state
    assert reads.shape == entries["m/w"].shape


def test_the_trainers_hashes_do_not_depend_on_the_hash_stream(tmp_path):
    """Steps whose state hash runs beside the next step give the log of steps hashed at once (the benchmark's sync
    mode, state_hash right after run_step), on the GPU, for several steps with in-place AdamW writes."""
    pytest.importorskip("triton")
    from training.presets import run_config
    from training.init import init_params
    from training.state_hash import state_entries
    from training.step import StepContext, TrainState, run_step
    from training.config import Topology

    cfg = run_config("tiny")
    logs = []
    for deferred in (False, True):
        ctx = StepContext.build(cfg, "cuda", backend="triton")
        st = TrainState.fresh(init_params(cfg.model, cfg.train.seed, ctx.device))
        g = torch.Generator().manual_seed(5)
        out, pending = [], None
        for _ in range(6):
            lo, hi = ctx.batch.window_range(st.step)
            ids = torch.randint(0, cfg.model.vocab_size, (hi - lo, cfg.model.seq_len + 1), generator=g).cuda()
            r = run_step(st, ids, Topology(), ctx, before_update=pending.fence if pending is not None else None)
            entries = state_entries(st, "{}", "code", {"window": st.step})
            if not deferred:
                out.append(state_hash(entries, r.memo))
                continue
            queued = queue_state_hash(entries, r.memo)
            if pending is not None:
                out.append(StateHashReader().read(pending))
            pending = queued
        if pending is not None:
            out.append(StateHashReader().read(pending))
        logs.append(out)
    assert logs[0] == logs[1] and len(set(logs[0])) == 6
