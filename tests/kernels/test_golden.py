"""Golden digests of every op case, forward and backward, and their invariance across CPU builds:
AVX2 vs the machine's best ISA, 1 vs 2 threads, and a 64-bit ARM CPU (emulated)."""
import json
import os
import subprocess
import sys

import pytest

from kernels import golden

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARM_PYTHON = os.environ.get("ARM_PYTHON", "")  # a script running its arguments with an emulated aarch64 Python


@pytest.fixture(scope="module")
def here():
    return golden.case_digests("cpu")


def _digests_in_subprocess(extra_env=None, args=(), python=(sys.executable,)):
    env = {**os.environ, "PYTHONPATH": ROOT, **(extra_env or {})}
    out = subprocess.run([*python, "-m", "kernels.golden", "--json", "-", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_every_case_matches_the_golden_file(here):
    problems = golden.diff(golden.load(), here)
    assert not problems, "numerics changed (regenerate with `python -m kernels.golden --write " \
                         "tests/kernels/golden.json` only if deliberate):\n" + "\n".join(problems)


def test_golden_file_covers_forward_and_backward_of_each_differentiable_op(here):
    with_grads = {name.split("[")[0] for name, outs in here.items() if any(k.startswith("d") for k in outs)}
    for op in ("exp", "log", "sqrt", "rsqrt", "sigmoid", "silu", "sum", "mean", "max", "hp_matmul"):
        assert op in with_grads, f"{op} has no backward case"


def test_same_digests_under_avx2(here):
    assert _digests_in_subprocess({"ATEN_CPU_CAPABILITY": "avx2"}) == here


def test_same_digests_with_one_and_two_threads(here):
    one = _digests_in_subprocess(args=("--threads", "1"))
    two = _digests_in_subprocess(args=("--threads", "2"))
    assert one == here and two == here


@pytest.mark.slow
@pytest.mark.arm
def test_same_digests_on_emulated_arm64(here):
    if not ARM_PYTHON or not os.path.exists(ARM_PYTHON):
        pytest.skip(f"no ARM emulator script (ARM_PYTHON={ARM_PYTHON!r}): set ARM_PYTHON to one")
    env = {"ARM_HOME": os.environ.get("ARM_HOME", os.path.expanduser("~/.cache/arm-python-auditable")),
           "ARM_PIP": "blake3"}
    arm = _digests_in_subprocess(env, python=("bash", ARM_PYTHON))
    assert golden.diff(here, arm) == []
