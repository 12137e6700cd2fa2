"""Init (a function of config and seed only), the model's structure and gradients, and the MoE."""
import os
import subprocess
import sys

import pytest
import torch

from training.config import ModelConfig, MoEConfig
from training.init import init_params, stream_id
from training.model import forward, rope_for
from training.moe import top_k
from training.windows import leaves
from training.params import param_specs
from kernels.digest import bits_equal, digest_many

MINI = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, ffn_hidden=48,
                   seq_len=16, window=8)
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _ids(cfg: ModelConfig, b: int = 2) -> torch.Tensor:
    return (torch.arange(b * (cfg.seq_len + 1)).reshape(b, -1) * 7919) % cfg.vocab_size


def test_init_depends_only_on_config_and_seed():
    a, b = init_params(MINI, 42), init_params(MINI, 42)
    assert digest_many(a) == digest_many(b)
    assert digest_many(init_params(MINI, 43)) != digest_many(a)
    # one Philox stream per name: a deeper model keeps the shallower one's tensors bit for bit
    deeper = init_params(ModelConfig(**{**MINI.__dict__, "n_layers": 3}), 42)
    assert bits_equal(deeper["layers.1.attn.wqkv.weight"], a["layers.1.attn.wqkv.weight"])
    assert bits_equal(deeper["embed.weight"], a["embed.weight"])


def test_init_digest_is_the_same_in_a_process_with_another_hash_seed():
    code = ("from training.init import init_params; from training.config import ModelConfig; from kernels.digest import "
            "digest_many; import tests.training.test_model as t; print(digest_many(init_params(t.MINI, 42)))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == digest_many(init_params(MINI, 42))


def test_init_distribution_dtypes_and_gains():
    p = init_params(MINI, 42)
    for s in param_specs(MINI):
        t = p[s.name]
        assert t.dtype == s.dtype and tuple(t.shape) == s.shape, s.name
        if s.kind in ("linear", "embedding", "head"):
            w = t.float()
            assert float(w.abs().max()) <= 0.04 * (1 + 2 ** -8), s.name  # +-2 sigma, bf16 rounding
            assert 0.012 < float(w.std()) < 0.02, s.name  # truncation at 2 sigma shrinks the std to ~0.88 sigma
        elif s.kind == "norm":
            assert bool((t == 1).all()), s.name
        else:
            assert t.dim() == 0 and float(t) > 0, s.name
    assert stream_id("embed.weight") != stream_id("head.weight")


def test_loss_at_init_is_about_log_vocab_and_every_parameter_gets_a_gradient():
    p = {k: v.float().requires_grad_() for k, v in init_params(MINI, 42).items()}
    out = forward(p, MINI, _ids(MINI), rope_for(MINI))
    assert out.ce.shape == (2,)  # per window
    assert all(abs(float(ce) - torch.log(torch.tensor(97.0)).item()) < 0.3 for ce in out.ce)
    grads = torch.autograd.grad(out.loss.sum(), list(p.values()))
    for name, g in zip(p, grads):
        assert g is not None and bool(torch.isfinite(g).all()) and float(g.abs().max()) > 0, name


def test_forward_and_backward_bits_repeat():
    p0 = init_params(MINI, 42)
    outs = []
    for _ in range(2):
        p = {k: v.float().requires_grad_() for k, v in p0.items()}
        out = forward(p, MINI, _ids(MINI), rope_for(MINI))
        outs.append(digest_many(dict(zip(p, torch.autograd.grad(out.loss.sum(), list(p.values()))))))
    assert outs[0] == outs[1]


def test_sliding_window_changes_only_local_layers():
    wide = ModelConfig(**{**MINI.__dict__, "window": 16})
    assert MINI.window_of(0) == 8 and MINI.window_of(1) is None and wide.window_of(0) is None
    p = {k: v.float() for k, v in init_params(MINI, 42).items()}
    a = forward(p, MINI, _ids(MINI), rope_for(MINI)).ce
    b = forward(p, wide, _ids(MINI), rope_for(MINI)).ce
    assert not bits_equal(a, b)


def test_top_k_ties_go_to_the_lower_expert():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [float("nan"), 1.0, 0.5, 1.0]])
    assert top_k(logits, 2).tolist() == [[1, 2], [0, 1], [1, 3]]


@pytest.mark.parametrize("shared", [0, 24])
def test_moe_forward_backward_and_load(shared):
    cfg = ModelConfig(**{**MINI.__dict__, "moe": MoEConfig(n_experts=4, top_k=2, expert_ffn=24, shared_ffn=shared)})
    p0 = init_params(cfg, 42)
    digests = []
    for _ in range(2):
        p = {k: v.float().requires_grad_() for k, v in p0.items()}
        out = forward(p, cfg, _ids(cfg), rope_for(cfg))
        grads = torch.autograd.grad(out.loss.sum(), list(p.values()), allow_unused=True)
        digests.append(digest_many({k: g for k, g in zip(p, grads) if g is not None}))
        assert sum(int(c.sum()) for c in out.load.values()) == cfg.n_layers * 2 * 16 * 2  # layers x tokens x k
        assert bool((out.aux.detach() > 0).all())
        assert grads[list(p).index("layers.0.moe.router.weight")] is not None
    assert digests[0] == digests[1]


@pytest.mark.parametrize("moe", [None, MoEConfig(n_experts=4, top_k=2, expert_ffn=24, shared_ffn=24)])
def test_per_window_leaves_get_each_window_alone_s_gradient(moe):
    """Three windows run together with a leaf per window and parameter: leaf i's gradient, window i's loss terms
    and the batch's expert loads are, bit for bit, what window i gives run alone (its own int8 steps and Hadamard
    blocks over its tokens, its own exact sums and routing statistics); batched, they would not be."""
    cfg = ModelConfig(**{**MINI.__dict__, "moe": moe})
    p = {k: v.float() for k, v in init_params(cfg, 42).items()}
    ids = _ids(cfg, 3)
    per = leaves(p, 3)
    out = forward(per, cfg, ids, rope_for(cfg))
    names = list(p)
    grads = torch.autograd.grad(out.loss.sum(), [t for k in names for t in per[k]], allow_unused=True)
    loads = None
    for i in range(3):
        alone = {k: v.detach().requires_grad_() for k, v in p.items()}
        one = forward(alone, cfg, ids[i:i + 1], rope_for(cfg))
        want = torch.autograd.grad(one.loss.sum(), list(alone.values()), allow_unused=True)
        for j, k in enumerate(names):
            got = grads[j * 3 + i]
            assert (got is None) == (want[j] is None), k
            assert got is None or bits_equal(got, want[j]), f"window {i}: {k}"
        for a, b in ((out.loss, one.loss), (out.ce, one.ce), (out.z, one.z)):
            assert bits_equal(a[i:i + 1].detach(), b.detach())
        loads = one.load if loads is None else {k: loads[k] + v for k, v in one.load.items()}
    assert {k: v.tolist() for k, v in out.load.items()} == {k: v.tolist() for k, v in (loads or {}).items()}
    # the same three windows with shared parameters: one gradient for the batch, not the sum of the windows' own
    shared = {k: v.detach().requires_grad_() for k, v in p.items()}
    batch = torch.autograd.grad(forward(shared, cfg, ids, rope_for(cfg)).loss.sum(), list(shared.values()),
                                allow_unused=True)
    w = names.index("layers.0.attn.wqkv.weight")
    assert not bits_equal(batch[w], grads[w * 3] + grads[w * 3 + 1] + grads[w * 3 + 2])
