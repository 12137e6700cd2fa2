import pytest
import torch

from quant.format import RVQProjection


def random_projection(seed: int = 0, e: int = 2, n: int = 32, k: int = 256, experts=None) -> RVQProjection:
    """A valid RVQProjection with random codes (finite E4M3 scales)."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.randint(0, 0x7E, (e, n, k // 128), generator=g, dtype=torch.int64)  # positive, finite
    return RVQProjection(
        codebooks=torch.randint(0, 16, (e, 2, 256, 8), generator=g, dtype=torch.int64).to(torch.uint8),
        indices=torch.randint(0, 256, (e, n, k // 8, 2), generator=g, dtype=torch.int64).to(torch.uint8),
        scales=scales.to(torch.uint8).view(torch.float8_e4m3fn),
        global_scale=torch.tensor(0.0123, dtype=torch.float32),
        experts=tuple(experts if experts is not None else range(e)))


@pytest.fixture
def make_projection():
    return random_projection


@pytest.fixture(autouse=True)
def one_thread():
    """The fit is many small ops: on 2 shared cores, OpenMP threads spin against other processes
    (a 256 x 256 sweep: 0.6 s on one thread, 6 s on two under load). Restored after each test."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
