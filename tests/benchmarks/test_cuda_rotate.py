"""benchmarks/cuda_rotate's CUDA kernels, checked on the CPU before any GPU time. Their butterfly schedules
(the row kernel's in-lane stages then lane exchanges by XOR shuffles, the column kernel's the other way round)
give the reference's Hadamard bits. Their arithmetic (the step, the codes, the rebuilt operand), as the
benchmark's torch stand-in runs it, gives the reference's codes, steps and flags. The whole benchmark runs
`--smoke` against the Triton kernel under the interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.cuda_rotate import lane_schedule_fwht, same
from kernels.ref import philox
from kernels.ref.hadamard import block_hadamard
from kernels.ref.fixed import pow2

ROOT = Path(__file__).resolve().parents[2]


def test_the_lane_schedule_gives_the_reference_bits():
    n = 64
    x = philox.normal(3, 0, (n, 256))
    x = x * pow2(philox.random_bits(3, 1, n * 256).reshape(n, 256) % 41 - 20).to(torch.float32)  # rounding in every stage
    x[0, :] = 3.0e38  # overflow to inf, then inf - inf: NaN where the reference has it
    x[1, :] = -0.0
    assert same(lane_schedule_fwht(x), block_hadamard(x, dim=1, block=256))


def test_the_upper_lane_takes_partner_minus_own():
    """A schedule that took own - partner on the upper lane flips signs: the test above would see it."""
    x = torch.zeros(1, 256)
    x[0, 0] = 1.0  # H e_0 = all ones
    assert torch.equal(lane_schedule_fwht(x), torch.ones(1, 256))
    x = torch.zeros(1, 256)
    x[0, 255] = 1.0  # H e_255 = the last row of H: signs (-1)^popcount(j)
    signs = torch.tensor([(-1.0) ** bin(j).count("1") for j in range(256)])
    assert torch.equal(lane_schedule_fwht(x)[0], signs)


def test_the_column_kernels_schedule_gives_the_reference_bits():
    from benchmarks.cuda_rotate import column_schedule_fwht

    n = 64
    x = philox.normal(4, 0, (n, 256))
    x = x * pow2(philox.random_bits(4, 1, n * 256).reshape(n, 256) % 41 - 20).to(torch.float32)
    x[0, :] = 3.0e38
    assert same(column_schedule_fwht(x), block_hadamard(x, dim=1, block=256))


def _run(variant, g, rows, c, pre=None):
    from benchmarks.cuda_rotate import emulated_launcher

    q = torch.empty((rows, c), dtype=torch.int8)
    step = torch.empty(rows)
    bad = torch.empty(rows, dtype=torch.int32)
    emulated_launcher(variant, g, q, step, bad, pre)()
    return q, step, bad


def test_the_kernels_arithmetic_gives_the_references_codes_steps_and_flags():
    """The CUDA kernels' quantization (step amax / 127, 1 for a NaN or zero amax; codes by code8), as their torch
    stand-in runs it, on rows with inf, NaN, a stage overflow, zeros, -0.0, an outlier and ties planted."""
    from benchmarks import cuda_rotate

    o = cuda_rotate.operand(16, 512, seed=7, device="cpu")
    want = cuda_rotate.reference(o)
    for variant, g in (("rows", o), ("cols", o.t().contiguous())):
        got = _run(variant, g, 16, 512)
        assert all(cuda_rotate.same(a, b) for a, b in zip(got, want)), variant


def test_the_rebuilt_operand_is_the_references_dequantized_code():
    """x_hat / w_hat: the column kernel's pre-scale rebuilds to_int8(x / s) * s before the rotation."""
    from benchmarks import cuda_rotate
    from kernels.ref import rotated_mm

    x = philox.normal(8, 0, (512, 32))  # [C, rows]
    s = torch.rand(512) * 0.1 + 0.01  # a step per C index (w_hat's s_w)
    rebuilt = rotated_mm.to_int8(x / s[:, None]).to(torch.float32) * s[:, None]
    want = cuda_rotate.reference(rebuilt.t().contiguous())
    got = _run("cols", x, 32, 512, pre=s)
    assert all(cuda_rotate.same(a, b) for a, b in zip(got, want))


@pytest.mark.slow
def test_smoke_run_matches_the_triton_kernel_under_the_interpreter(tmp_path):
    """`cuda_rotate.py --smoke`: the whole benchmark on the CPU, the kernels' stand-in against the Triton kernel."""
    pytest.importorskip("triton")  # the `gpu` extra
    out = tmp_path / "smoke.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_rotate.py"), "--smoke", "--out", str(out)],
                   check=True, env=env, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())["rows"]
    assert {r["kind"] for r in rows} == {"rows", "cols", "x_hat", "w_hat"}
    for r in rows:
        for variant, v in r["cuda"].items():
            assert all(v["bits_vs_triton"].values()), (r["kind"], variant, v)
            assert all(v.get("bits_vs_reference", {"-": True}).values()), (r["kind"], variant, v)


def test_the_baseline_is_a_revision_or_a_file(tmp_path):
    """--baseline names a git revision here, or a copy of the source on a machine without the history."""
    from benchmarks.cuda_rotate import baseline_source
    src = tmp_path / "rotate_quantize_old.cu"
    src.write_text("// old kernels\n")
    assert baseline_source(str(src)) == ("rotate_quantize_old", "// old kernels\n")
    tag, text = baseline_source("HEAD")
    assert tag == "HEAD" and text == subprocess.run(["git", "show", "HEAD:kernels/cuda/rotate_quantize.cu"], cwd=ROOT,
                                                     check=True, capture_output=True, text=True).stdout
    with pytest.raises(SystemExit, match="no-such-revision-0123"):
        baseline_source("no-such-revision-0123")
