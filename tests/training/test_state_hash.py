"""The state hash follows its documented serialization, covers every part of the state, and chains."""
import struct

import blake3
import numpy as np
import torch

from training.optim import SpikeState
from training.state_hash import FORMAT, ZERO, canonical_json, chain, state_entries, state_hash
from training.step import TrainState


def _state() -> TrainState:
    p = {"b.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16),
         "a.s_x": torch.tensor(0.25)}
    st = TrainState.fresh(p)
    st.m["b.weight"][0, 1] = 1.5
    st.grads["a.s_x"] = torch.tensor(-2.0)
    st.adam_step, st.step, st.tokens = 3, 4, 512
    st.spike = SpikeState(1, 1, 4)
    return st


def _independent_hash(st: TrainState, cfg: str, code: str, stream_state: dict) -> bytes:
    """The module docstring's format, written out again from the text."""
    items = []
    for prefix, d in (("param", st.params), ("m", st.m), ("v", st.v), ("grad", st.grads)):
        for k, t in d.items():
            items.append((f"{prefix}/{k}", t))
    meta = {"meta/code_version": code.encode(), "meta/config": cfg.encode(),
            "meta/counters": canonical_json({"adam_step": st.adam_step, "step": st.step, "tokens": st.tokens}),
            "meta/spike": canonical_json(st.spike.as_dict()), "meta/stream": canonical_json(stream_state)}
    items += list(meta.items())
    h = blake3.blake3(FORMAT)
    for name, v in sorted(items, key=lambda kv: kv[0].encode()):
        nb = name.encode()
        if isinstance(v, torch.Tensor):
            dt = str(v.dtype).split(".")[1].encode()
            raw = v.contiguous().view({2: torch.int16, 4: torch.int32}[v.element_size()]).numpy().astype(
                np.dtype(f"<i{v.element_size()}")).tobytes()
            h.update(struct.pack("<I", len(nb)) + nb + bytes([0]) + struct.pack("<I", len(dt)) + dt
                     + struct.pack("<I", v.dim()) + b"".join(struct.pack("<Q", s) for s in v.shape)
                     + struct.pack("<Q", len(raw)) + blake3.blake3(raw).digest())
        else:
            h.update(struct.pack("<I", len(nb)) + nb + bytes([1]) + struct.pack("<Q", len(v)) + v)
    return h.digest()


def test_hash_follows_the_documented_serialization():
    st = _state()
    stream_state = {"window": 8, "format": "stream-state/1"}
    got = state_hash(state_entries(st, '{"x":1}', "code", stream_state))
    assert got == _independent_hash(st, '{"x":1}', "code", stream_state)


def test_every_part_of_the_state_changes_the_hash():
    base = state_hash(state_entries(_state(), "{}", "c", {"window": 8}))
    changes = []
    for mutate in (lambda s: s.params["b.weight"].view(torch.int16).__setitem__((1, 2), 1),
                   lambda s: s.m["a.s_x"].fill_(1e-30), lambda s: s.v["b.weight"].__setitem__((0, 0), -0.0),
                   lambda s: s.grads["b.weight"].__setitem__((1, 1), 1.0),
                   lambda s: setattr(s, "adam_step", 2), lambda s: setattr(s, "tokens", 513),
                   lambda s: setattr(s, "step", 5), lambda s: setattr(s.spike, "remaining", 0)):
        st = _state()
        mutate(st)
        changes.append(state_hash(state_entries(st, "{}", "c", {"window": 8})))
    changes.append(state_hash(state_entries(_state(), "{ }", "c", {"window": 8})))
    changes.append(state_hash(state_entries(_state(), "{}", "d", {"window": 8})))
    changes.append(state_hash(state_entries(_state(), "{}", "c", {"window": 9})))
    assert base not in changes and len(set(changes)) == len(changes)


def test_insertion_order_does_not_matter_and_the_chain_links():
    st = _state()
    e1 = state_entries(st, "{}", "c", {})
    e2 = dict(reversed(list(e1.items())))
    assert state_hash(e1) == state_hash(e2)
    s = state_hash(e1)
    assert chain(ZERO, s) == blake3.blake3(bytes(32) + s).digest()
    assert chain(chain(ZERO, s), s) != chain(ZERO, s)


def test_digests_hashed_in_place_equal_the_definition_over_copied_bytes():
    """digest_many hashes tensors in place on several threads; its value is the module doc's definition, written
    out here over copied little-endian bytes."""
    from kernels.digest import digest_many, tensor_bytes

    named = {"w": torch.linspace(-1, 1, 7921).to(torch.bfloat16).reshape(89, 89), "s": torch.tensor(0.5),
             "e": torch.zeros(0, 3), "i": torch.arange(5)}
    want = blake3.blake3()
    for name in sorted(named):
        t = named[name]
        one = blake3.blake3(f"{str(t.dtype).removeprefix('torch.')}|{tuple(t.shape)}|".encode() + tensor_bytes(t))
        want.update(name.encode() + b"\0" + one.hexdigest().encode())
    assert digest_many(named) == want.hexdigest()


def test_memo_reuses_the_steps_digests_and_named_digest_binds_dtype_and_shape():
    from kernels.digest import DigestMemo, PendingNamed, named_digest

    st = _state()
    memo = DigestMemo()
    named_digest({f"m/{k}": v for k, v in st.m.items()}, memo)
    entries = state_entries(st, "{}", "c", {})
    assert state_hash(entries, memo) == state_hash(entries)
    w = torch.arange(6, dtype=torch.float32)
    base = named_digest({"w": w})
    assert PendingNamed({"w": w}).hex() == base
    assert base != named_digest({"w": w.reshape(2, 3)}) and base != named_digest({"w": w.view(torch.int32)})
    assert base != named_digest({"x": w}) and base == named_digest({"w": w.clone()})


def test_memo_queue_hashes_each_tensor_once_and_gives_the_same_digests(monkeypatch):
    import kernels.digest as dg

    a, b, c = torch.arange(9, dtype=torch.float32), torch.ones(4, dtype=torch.bfloat16), torch.tensor(-0.0)
    hashed = []
    real = dg.queue_raw
    monkeypatch.setattr(dg, "queue_raw", lambda ts: hashed.extend(id(t) for t in ts) or real(ts))
    memo = dg.DigestMemo()
    memo.queue([a, b, a])
    memo.queue([b, c])  # b is in flight already: only c is new
    assert sorted(hashed) == sorted([id(a), id(b), id(c)])
    got_named, got_raw = dg.named_digest({"a": a, "c": c}, memo), memo.digests([b, a])
    assert len(hashed) == 3  # read from the queue, not hashed again
    assert got_named == dg.named_digest({"a": a, "c": c}) and got_raw == dg.raw_digests([b, a])


def test_state_hash_queues_the_digests_before_serializing_the_heads(monkeypatch):
    """The device hashes while the host builds the entries' heads: every digest is queued before the first head,
    and read after the last (one wait, the GPU busy meanwhile)."""
    import kernels.digest as dg
    import training.state_hash as sh

    events = []
    queue, digests, head = dg.DigestMemo.queue, dg.DigestMemo.digests, sh._tensor_head
    monkeypatch.setattr(dg.DigestMemo, "queue", lambda self, ts: (events.append("queue"), queue(self, ts))[1])
    monkeypatch.setattr(dg.DigestMemo, "digests", lambda self, ts: (events.append("read"), digests(self, ts))[1])
    monkeypatch.setattr(sh, "_tensor_head", lambda k, t: (events.append("head"), head(k, t))[1])
    entries = state_entries(_state(), "{}", "c", {})
    got = state_hash(entries)
    heads = [i for i, e in enumerate(events) if e == "head"]
    assert events.index("queue") < heads[0] and heads[-1] < events.index("read") and events.count("read") == 1
    monkeypatch.undo()
    assert got == state_hash(entries) == _independent_hash(_state(), "{}", "c", {})


# the step's modules that decide no bit: errors, the overlap's schedule (when a partial is added, not what), the
# transport under the collectives, the backend switch (every backend gives kernels/ref's bits), and the packages'
# docstrings and re-exports
PACKAGES = ("training", "collectives", "kernels", "stream")
NO_BITS = {"training/errors.py", "training/overlap.py", "collectives/group.py", "kernels/__init__.py",
           "training/__init__.py", "collectives/__init__.py"}


def test_every_module_of_the_step_is_in_the_code_version():
    """A source that the step imports and the code version leaves out could change a run's bits without changing
    the code version that its log names."""
    import subprocess
    import sys
    from pathlib import Path

    from training.state_hash import CODE_GLOBS, ROOT

    mods = ("training.step", "training.model", "training.init", "training.optim", "training.strategies",
            "training.sharding", "training.reduction", "training.windows", "stream")
    code = (f"import sys, {', '.join(mods)}\n"
            "print('\\n'.join(getattr(m, '__file__', None) or '' for m in list(sys.modules.values())))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [Path(f).resolve() for f in out.split()]
    ours = {f.relative_to(ROOT).as_posix() for f in files if any(f.is_relative_to(ROOT / d) for d in PACKAGES)}
    covered = {p.relative_to(ROOT).as_posix() for g in CODE_GLOBS for p in ROOT.glob(g)}
    missing = sorted(ours - covered - NO_BITS)
    assert ours and not missing, f"imported by the step, not in CODE_GLOBS: {missing}"
