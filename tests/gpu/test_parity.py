"""Every op case, forward and backward, on CUDA vs this machine's CPU: 0 mismatching bits."""
import pytest
import torch

from kernels.cases import registry, run_case
from kernels.digest import first_mismatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CASES = registry()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cuda_matches_cpu_bit_for_bit(case):
    cpu = run_case(case, "cpu")
    gpu = run_case(case, "cuda")
    assert sorted(cpu) == sorted(gpu)
    for name in cpu:
        assert cpu[name].dtype == gpu[name].dtype and cpu[name].shape == gpu[name].shape, name
        where = first_mismatch(cpu[name], gpu[name])
        assert where is None, f"{case.name}.{name}: first differing element {where[0]}: cpu {where[1]!r} cuda {where[2]!r}"
