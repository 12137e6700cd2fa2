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


@pytest.fixture(scope="session")
def tiny_donor():
    """tiny-moe at its (Philox) init: a real MoE of the project, no training run needed."""
    from training.init import init_params
    from training.presets import preset
    from quant.donor import Donor
    cfg = preset("tiny-moe")
    params = {k: v.float() for k, v in init_params(cfg.model, 7).items()}
    return Donor(cfg, params, "init:7", 0)


@pytest.fixture(scope="session")
def tiny_data(tiny_donor):
    """Calibration windows per split: Philox token ids (train 16, val 4, audit 4 windows of 65)."""
    from kernels.ref.philox import random_bits
    m = tiny_donor.cfg.model
    out = {}
    for i, (name, n) in enumerate((("train", 16), ("val", 4), ("audit", 4))):
        out[name] = (random_bits(3, 50 + i, n * (m.seq_len + 1)) % m.vocab_size).reshape(n, -1)
    return out


def small_spec(out, **kw):
    """A RunSpec small enough for CI: few updates, small microbatches, a small EM sample."""
    from quant.fit import FitConfig
    from quant.pv import PVConfig
    from quant.sequential import RunSpec
    pv = PVConfig(updates=kw.pop("updates", 4), microbatches=2, micro_rows=256, reassign_every=2, validate_every=2)
    return RunSpec(model="init:7", out=str(out), layers=kw.pop("layers", (0,)), pv=pv,
                   fit=FitConfig(sample_groups=1000), compare=kw.pop("compare", False), **kw)


HF_MODELS = __import__("pathlib").Path(__file__).parent / "hf_models"   # written by hf_models/build.py


@pytest.fixture(scope="session")
def hf_data(demo_corpus):
    """Calibration windows (train 16, val 4, audit 4, held_out) of the demo corpus read with the tiny Hugging
    Face models' tokenizer (both models share one tokenizer.json, so one build serves both)."""
    from quant.calib import CalibConfig, build
    tok = [(HF_MODELS / m / "tokenizer.json").read_bytes() for m in ("tiny-mixtral", "tiny-qwen2-moe")]
    assert tok[0] == tok[1]
    return build(CalibConfig(corpus=str(demo_corpus), train=16, val=4, audit=4),
                 tokenizer=HF_MODELS / "tiny-mixtral" / "tokenizer.json", separator=0)


@pytest.fixture(scope="session")
def hf_donor():
    """name -> the loaded Hugging Face donor (each loaded once per test run)."""
    from quant.hf_donor import load_hf_donor
    cache = {}

    def get(name: str):
        if name not in cache:
            cache[name] = load_hf_donor(str(HF_MODELS / name))
        return cache[name]
    return get


def hf_spec(model: str, out, updates: int = 2, **kw):
    """A RunSpec for the tiny Hugging Face models, small enough for CI."""
    from quant.fit import FitConfig
    from quant.pv import PVConfig
    from quant.sequential import RunSpec
    pv = PVConfig(updates=updates, microbatches=2, micro_rows=256, reassign_every=2, validate_every=2)
    return RunSpec(model=str(HF_MODELS / model), out=str(out), pv=pv,
                   fit=FitConfig(sample_groups=1000, kmeans_iters=4, em_iters=4, beam=2),
                   compare=False, **kw)
