"""kernels/cuda/rotate.py on a machine without CUDA: which operands the CUDA kernels take (the rest stay with the
Triton kernel), that the launcher's argument lists match the kernels' parameters in the source, and that nothing
is built or launched for a CPU tensor. The kernels' bits are tests/gpu/test_cuda_rotate.py's."""
from __future__ import annotations

import pytest
import torch

from kernels.cuda import rotate

F32 = torch.float32


def test_c_contiguous_rows_take_the_row_kernel():
    g = torch.zeros(8, 2048)
    assert rotate.layout(g, 8, 2048, 2048, 1, 256, None) == "rows"
    assert rotate.layout(g, 8, 16384, 16384, 1, 256, None) == "rows"  # the most a row holds in registers


@pytest.mark.parametrize("why,args", [
    ("C not a multiple of 256", (8, 300, 300, 1, 256, None)),
    ("a block of 16", (8, 512, 512, 1, 16, None)),
    ("no rotation", (8, 512, 512, 1, None, None)),
    ("C past the registers", (8, 16640, 16640, 1, 256, None)),
    ("rows not 16-byte aligned", (8, 512, 514, 1, 256, None)),
    ("a pre-scale on rows", (8, 512, 512, 1, 256, torch.tensor(0.5))),
    ("neither C nor the rows contiguous", (8, 512, 2, 16, 256, None)),
    ("no rows", (0, 512, 512, 1, 256, None)),
])
def test_every_other_operand_stays_with_the_triton_kernel(why, args):
    g = torch.zeros(70000)
    assert rotate.layout(g, *args) is None, why


def test_misaligned_views_and_other_dtypes_stay_with_the_triton_kernel():
    g = torch.zeros(9, 2048)
    assert rotate.layout(g.view(-1)[1:], 4, 2048, 2048, 1, 256, None) is None  # base off by 4 bytes
    assert rotate.layout(g.to(torch.bfloat16), 9, 2048, 2048, 1, 256, None) is None


def test_strided_c_with_adjacent_rows_takes_the_column_kernels():
    g = torch.zeros(2048, 100)  # G [m, n]: its columns are the operand's rows, C = m strided by n
    assert rotate.layout(g, 100, 2048, 1, 100, 256, None) == "cols"
    assert rotate.layout(g, 100, 2048, 1, 100, 256, torch.tensor(0.5)) == "cols"  # x_hat: one step
    assert rotate.layout(g, 100, 2048, 1, 100, 256, torch.rand(2048)) == "cols"  # w_hat: a step per C index
    assert rotate.layout(g, 100, 2048, 1, 100, 256, torch.rand(2000)) is None  # a step short
    assert rotate.layout(g, 100, 2048, 1, 100, 256, torch.rand(2048, dtype=torch.float64)) is None


def test_col_splits_aim_at_four_ctas_an_sm_within_the_blocks():
    assert rotate.col_splits(2048, 8192, 132) == 9  # 64 column groups: 528 CTAs wanted
    assert rotate.col_splits(11264, 8192, 132) == 2
    assert rotate.col_splits(32, 512, 132) == 2  # no more splits than Hadamard blocks
    assert rotate.col_splits(20000, 8192, 132) == 1


def test_the_argument_lists_match_the_kernels_parameters():
    """The launcher turns tensors into pointers and Python ints into C ints: every parameter must be one or the
    other, in the order the argument lists give them (a `long long` stride would read 4 stray bytes)."""
    t, words = torch.zeros(4), torch.zeros(3, 4, dtype=torch.int32)
    kinds = lambda args: ["ptr" if isinstance(a, torch.Tensor) else "int" for a in args]  # noqa: E731
    sig = rotate.signatures()
    assert kinds(rotate.rows_args(t, t, t, t, 512, 512, 512)) == sig["rotate_quantize_rows"]
    for pre in (None, torch.tensor(0.5), torch.rand(512)):
        assert kinds(rotate.cols_args(t, t, t, t, 8, 8, 512, 512, pre)) == sig["rotate_quantize_cols"]
        amax, codes = rotate.split_args(t, t, t, t, 8, 8, 512, 512, pre, words)
        assert kinds(amax) == sig["rotate_cols_amax"] and kinds(codes) == sig["rotate_cols_codes"]
    assert set(sum(sig.values(), [])) == {"ptr", "int"}


def test_the_pre_scale_arguments():
    step = torch.zeros(4)
    assert rotate.cols_args(step, step, step, step, 8, 8, 512, 512, None)[-3:] == [0, step, 0]
    scalar, per_c = torch.tensor(0.5), torch.rand(512)
    assert rotate.cols_args(step, step, step, step, 8, 8, 512, 512, scalar)[-3:] == [1, scalar, 0]
    assert rotate.cols_args(step, step, step, step, 8, 8, 512, 512, per_c)[-3:] == [1, per_c, 1]


def test_a_cpu_tensor_builds_and_launches_nothing(monkeypatch):
    monkeypatch.setattr(rotate, "_kernels", lambda device: pytest.fail("built for a CPU tensor"))
    g = torch.zeros(8, 512)
    q, step, bad = torch.empty(8, 512, dtype=torch.int8), torch.empty(8), torch.empty(8, dtype=torch.int32)
    assert rotate.launch(g, 8, 512, 512, 1, 256, None, q, step, bad) is False


def test_triton_only_turns_the_kernels_off_and_back_on_after_an_error():
    before = rotate._enabled
    with pytest.raises(RuntimeError):
        with rotate.triton_only():
            assert rotate.status() == "off"
            raise RuntimeError("inside")
    assert rotate._enabled == before


def test_status_without_cuda_names_the_reason():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: tests/gpu/test_cuda_rotate.py checks the build")
    assert rotate.status() in ("off", "not built: no CUDA device")


def test_the_source_is_packaged():
    import tomllib
    from pathlib import Path

    root = Path(rotate.__file__).resolve().parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["kernels"]
    assert rotate.SOURCE.relative_to(root / "kernels").as_posix() in {p.replace("*.cu", rotate.SOURCE.name)
                                                                        for p in data}
