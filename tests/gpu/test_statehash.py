"""On-device BLAKE3 (kernels/triton/statehash.py) equals the stock CPU blake3 on the same bytes."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")
blake3 = pytest.importorskip("blake3")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

from kernels import digest  # noqa: E402
from kernels.ref import philox  # noqa: E402
from kernels.triton import statehash  # noqa: E402

SEED = int.from_bytes(os.urandom(4), "little")


@pytest.fixture(params=[(False, False), (True, False), (True, True)],
                ids=["tile loads", "16-byte loads", "16-byte loads a block ahead"])
def loads(request, monkeypatch):
    """The ways the chunk kernel reads whole programs (statehash.VECTOR_LOADS, statehash.PREFETCH)."""
    monkeypatch.setattr(statehash, "VECTOR_LOADS", request.param[0])
    monkeypatch.setattr(statehash, "PREFETCH", request.param[1])


@pytest.mark.parametrize("n", [0, 1, 3, 63, 64, 65, 1023, 1024, 1025, 2047, 2048, 3073, 1 << 20, (1 << 20) + 3,
                               5 * (1 << 20) + 1000, 123_456_789])
def test_blake3_matches_cpu(n, loads):
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(SEED + n))
    assert statehash.blake3_digest(data.cuda()) == blake3.blake3(data.numpy().tobytes()).digest()


def test_many_tensors_in_one_pass_match_cpu(loads):
    """raw_digests hashes a list together (a table maps programs to tensors): sizes at the chunk, program
    (128 KiB) and group (32 MiB) boundaries, empty and odd-sized ones, in one batch, each equal to stock blake3."""
    kib = 1024
    sizes = [0, 5, 1024, 128 * kib - 1, 128 * kib, 128 * kib + 1, 32 * kib * kib - 4, 32 * kib * kib,
             32 * kib * kib + 4, 33 * kib * kib + 3, 1, 257 * 128 * kib, 7]
    g = torch.Generator().manual_seed(SEED)
    data = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g) for n in sizes]
    got = statehash.raw_digests([d.cuda() for d in data])
    assert got == [blake3.blake3(d.numpy().tobytes()).digest() for d in data]


def test_tensor_digests_match_kernels_digest():
    named = {"w": philox.normal(SEED, 0, (333, 517)), "b16": philox.normal(SEED, 1, (7, 3)).to(torch.bfloat16),
             "ids": torch.arange(1001, dtype=torch.int64), "odd": torch.arange(5, dtype=torch.uint8),
             "scalar": torch.tensor(3.5)}
    for name, t in named.items():
        assert statehash.tensor_digest(t.cuda()) == digest.tensor_digest(t), name
    assert statehash.digest_many({k: v.cuda() for k, v in named.items()}) == digest.digest_many(named)


def test_state_hash_on_device_equals_host():
    """training.state_hash over a CUDA state (hashed in one device buffer) equals the host serialization's."""
    from kernels.digest import digest_many as app_digest_many
    from training.state_hash import state_hash

    entries = {"param/w": philox.normal(SEED, 2, (257, 129)).to(torch.bfloat16), "m/w": philox.normal(SEED, 3, (257, 129)),
               "grad/odd": torch.arange(7, dtype=torch.uint8), "meta/config": b'{"a":1}', "meta/empty": b"",
               "v/scalar": torch.tensor(2.5), "v/none": torch.zeros(0)}
    on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in entries.items()}
    assert state_hash(on_gpu) == state_hash(entries)
    tensors = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
    assert app_digest_many({k: v.cuda() for k, v in tensors.items()}) == app_digest_many(tensors)


def test_raw_and_named_digests_on_device_equal_host():
    """kernels.digest' stage digests and raw digests: CUDA (one batched device pass) == CPU."""
    from kernels.digest import DigestMemo, named_digest, raw_digests

    named = {"w": philox.normal(SEED, 4, (1025, 333)), "b16": philox.normal(SEED, 5, (3, 1)).to(torch.bfloat16),
             "big": torch.randint(0, 256, (130 * 1024 * 1024 + 7,), dtype=torch.uint8), "none": torch.zeros(0, 4)}
    on_gpu = {k: v.cuda() for k, v in named.items()}
    assert raw_digests(list(on_gpu.values())) == [blake3.blake3(digest.tensor_bytes(v)).digest() for v in named.values()]
    memo = DigestMemo()
    assert named_digest(on_gpu, memo) == named_digest(named) == named_digest(on_gpu, memo)


def test_pending_named_digest_is_read_after_its_tensors_are_freed():
    """PendingNamed queues the hashing and holds no tensor: freeing and reusing the memory before hex() is safe."""
    from kernels.digest import PendingNamed, named_digest

    named = {"w": philox.normal(SEED, 6, (513, 1031)), "b16": philox.normal(SEED, 7, (9, 5)).to(torch.bfloat16)}
    on_gpu = {k: v.cuda() for k, v in named.items()}
    pending = PendingNamed(on_gpu)
    del on_gpu
    junk = torch.full((513 * 1031 * 4,), 7, dtype=torch.uint8, device="cuda")  # likely the freed block
    assert pending.hex() == named_digest(named) == pending.hex()
    del junk


def test_views_off_the_16_byte_grid_are_hashed_through_an_aligned_copy(loads):
    """The chunk kernel loads each lane's words 16 bytes at a time, which a misaligned address would fault on:
    views that start 4, 8 or 12 bytes past an aligned address (and large enough for whole programs) are hashed
    from an aligned copy, each equal to stock blake3, and digest_words refuses such a buffer by its index."""
    base = torch.randint(-2**31, 2**31 - 1, (300_000,), dtype=torch.int32,
                         generator=torch.Generator().manual_seed(SEED)).cuda()
    views = [base[k:] for k in (1, 2, 3, 4, 5)]
    assert [v.data_ptr() % 16 for v in views] == [4, 8, 12, 0, 4]
    assert statehash.raw_digests(views) == [blake3.blake3(v.cpu().numpy().tobytes()).digest() for v in views]
    with pytest.raises(ValueError, match=r"buffer 1 starts at 0x[0-9a-f]+, not 16-byte aligned"):
        statehash.digest_words([(base, 4 * 300_000), (base[1:], 4 * 299_999)])


def test_a_kept_plan_hashes_the_bytes_there_now(loads):
    """digest_words keeps its launch tables by the buffers' addresses and sizes (the state hash hashes the same
    tensors every step): written in place, hashed again, the digests are the new bytes'; another set of tensors
    gets its own plan; the same list again takes the kept one."""
    g = torch.Generator().manual_seed(SEED)
    ts = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g).cuda() for n in (4096, 128 * 1024 + 16, 3 << 20)]
    statehash._plans.clear()
    assert statehash.raw_digests(ts) == [blake3.blake3(t.cpu().numpy().tobytes()).digest() for t in ts]
    for t in ts:
        t[1:2] ^= 1
    assert statehash.raw_digests(ts) == [blake3.blake3(t.cpu().numpy().tobytes()).digest() for t in ts]
    assert len(statehash._plans) == 1
    others = [t.clone() for t in ts[::-1]]
    assert statehash.raw_digests(others) == [blake3.blake3(t.cpu().numpy().tobytes()).digest() for t in others]
    assert len(statehash._plans) == 2
