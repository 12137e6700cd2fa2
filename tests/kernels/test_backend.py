"""kernels.backend: "ref" is the reference package; "triton" is optional and falls back per op."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kernels


def test_ref_backend_is_the_reference_package():
    assert kernels.backend("ref") is kernels.ref
    assert kernels.backend() is kernels.ref


def test_unknown_backend_names_the_choices():
    with pytest.raises(ValueError, match="ref"):
        kernels.backend("cuda")


def test_kernels_imports_without_triton():
    code = ("import sys; sys.modules['triton'] = None\n"
            "import kernels, kernels.ref.rmsnorm\n"
            "assert kernels.backend('ref') is kernels.ref\n"
            "try:\n    kernels.backend('triton')\nexcept ModuleNotFoundError as e:\n    assert 'triton' in str(e)\n"
            "else:\n    raise SystemExit('backend(triton) should need triton')\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_triton_namespace_twins_and_fallbacks():
    pytest.importorskip("triton")
    b = kernels.backend("triton")
    from kernels.ref import philox, reduce as r_reduce
    from kernels.triton import rmsnorm as t_rms

    assert b.rmsnorm is t_rms and b.rmsnorm.rmsnorm is t_rms.rmsnorm
    assert b.reduce.dot is r_reduce.dot            # no twin: the reference op
    assert b.philox is philox                       # no twin module: the reference module
    x = torch.linspace(-3, 3, 70).reshape(7, 10)    # CPU tensors: the twin runs the reference
    assert torch.equal(b.rmsnorm.rmsnorm(x), kernels.ref.rmsnorm.rmsnorm(x))
