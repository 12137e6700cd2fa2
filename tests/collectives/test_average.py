import pytest
import torch

from collectives.average import average_, reciprocal


@pytest.mark.parametrize("n", [1, 2, 3, 6, 7, 288])
def test_average_multiplies_by_the_float32_reciprocal(n, h):
    x = h.partials(1, 4097, seed=n)[0]
    r = reciprocal(n)
    assert r.dtype == torch.float32 and r.item() == torch.tensor(1.0 / n, dtype=torch.float32).item()
    y = average_(x.clone(), n)
    assert h.same_bits(y, x * r)


def test_reciprocal_multiply_is_not_division(h):
    """For non-powers of two the reciprocal multiply and true division differ somewhere: the choice matters."""
    x = h.partials(1, 100_000, seed=1)[0]
    assert not h.same_bits(average_(x.clone(), 3), x / torch.tensor(3.0))


def test_bad_counts_raise():
    for n in (0, -1, 2.0, True):
        with pytest.raises(ValueError):
            reciprocal(n)
