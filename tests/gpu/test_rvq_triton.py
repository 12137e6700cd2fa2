"""The Triton rvq256_256x8 kernels against the CPU decoder: decode bit for bit, decode-and-multiply within
float32 GEMM rounding, and a loaded Hugging Face model whose ARVQ experts run them."""
import os

import pytest
import torch

from kernels.digest import bits_equal, first_mismatch
from quant.format import decode as cpu_decode

# TRITON_INTERPRET=1 runs the kernels on the CPU through Triton's interpreter: a logic check, never GPU evidence
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRET), reason="needs CUDA")]
DEV = torch.device("cpu" if INTERPRET else "cuda")


def _projection(seed: int, e: int, n: int, k: int):
    from tests.quant.conftest import random_projection
    return random_projection(seed, e, n, k)


def _codes(p, slot: int):
    return tuple(t.to(DEV) for t in (p.codebooks[slot], p.indices[slot], p.scales[slot], p.global_scale))


@pytest.mark.parametrize("n,k", [(16, 128), (48, 256), (256, 128)])
def test_decode_gives_the_cpu_decoders_bits(n, k):
    from quant import rvq_triton
    p = _projection(3, 2, n, k)
    for slot in range(2):
        got = rvq_triton.decode(*_codes(p, slot)).cpu()
        want = cpu_decode(p, slot)
        assert bits_equal(got, want), f"slot {slot}: first mismatch {first_mismatch(got, want)}"


@pytest.mark.parametrize("m,n,k", [(1, 32, 128), (37, 64, 256), (130, 256, 128)])
def test_linear_matches_decode_then_multiply(m, n, k):
    from quant import rvq_triton
    p = _projection(5, 1, n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    got = rvq_triton.linear(x.to(DEV), *_codes(p, 0)).cpu().double()
    w = cpu_decode(p, 0).double()
    want = x.double() @ w.T
    bound = 1e-5 * (x.double().abs() @ w.abs().T)         # float32 accumulation over k terms
    assert bool(((got - want).abs() <= bound + 1e-30).all())


def test_loaded_model_runs_its_arvq_experts_on_the_kernel(tmp_path):
    """A published tiny Mixtral: the same logits (to float32 GEMM rounding) with the Triton path as with the CPU one."""
    from quant import sequential
    from quant.hf_loader import load_quantized
    from tests.quant.conftest import HF_MODELS, hf_spec
    from quant.hf_donor import load_hf_donor
    from quant.calib import CalibConfig
    from stream import build_demo
    donor = load_hf_donor(str(HF_MODELS / "tiny-mixtral"))
    build_demo(tmp_path / "corpus", vocab_size=4096, progress=False)
    data = donor.calibration(CalibConfig(corpus=str(tmp_path / "corpus"), train=16, val=4, audit=4))
    sequential.run(hf_spec("tiny-mixtral", tmp_path / "arvq", updates=0), donor=donor, data=data)
    ids = data["held_out"][:2]
    ref = load_quantized(HF_MODELS / "tiny-mixtral", tmp_path / "arvq")
    with torch.no_grad():
        want = ref(input_ids=ids).logits
        model = load_quantized(HF_MODELS / "tiny-mixtral", tmp_path / "arvq").to(DEV)
        for layer in model.model.layers:
            layer.mlp.experts.kernel = "triton"
        got = model(input_ids=ids.to(DEV)).logits.cpu()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-4
