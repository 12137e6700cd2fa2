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


@pytest.mark.parametrize("n", [0, 1, 3, 63, 64, 65, 1023, 1024, 1025, 2047, 2048, 3073, 1 << 20, (1 << 20) + 3,
                               5 * (1 << 20) + 1000, 123_456_789])
def test_blake3_matches_cpu(n):
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(SEED + n))
    assert statehash.blake3_digest(data.cuda()) == blake3.blake3(data.numpy().tobytes()).digest()


def test_tensor_digests_match_kernels_digest():
    named = {"w": philox.normal(SEED, 0, (333, 517)), "b16": philox.normal(SEED, 1, (7, 3)).to(torch.bfloat16),
             "ids": torch.arange(1001, dtype=torch.int64), "odd": torch.arange(5, dtype=torch.uint8),
             "scalar": torch.tensor(3.5)}
    for name, t in named.items():
        assert statehash.tensor_digest(t.cuda()) == digest.tensor_digest(t), name
    assert statehash.digest_many({k: v.cuda() for k, v in named.items()}) == digest.digest_many(named)
