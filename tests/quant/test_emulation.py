"""Cold arithmetic: the default is the donor's own expert bits; the emulation's planes and fp16 boundaries."""
import torch

from training.layers import ffn
from kernels.digest import bits_equal
from quant.student import expert_forward, fp4_planes


def test_default_arithmetic_is_the_donors_expert(tiny_donor):
    p = tiny_donor.params
    x = torch.randn(40, 128, generator=torch.Generator().manual_seed(0))
    pre = "layers.1.moe.experts.2"
    w13, w2 = tiny_donor.expert_weights(1, 2)
    y = expert_forward(x, w13, w2, (p[f"{pre}.w_gate_up.s_x"], p[f"{pre}.w_down.s_x"]))
    assert bits_equal(y, ffn(p, pre, x))


def test_fp4_planes_converge_and_gradients_pass_straight_through(tiny_donor):
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)) * 3
    errs = [float((fp4_planes(x, k) - x).abs().max() / x.abs().max()) for k in (1, 2, 4)]
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-3
    w13, w2 = (w.clone().requires_grad_(True) for w in tiny_donor.expert_weights(0, 1))
    xe = x[:, :128].clone().requires_grad_(True)
    y = expert_forward(xe, w13, w2, (None, None), emulate=True)
    y.square().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) and float(t.grad.abs().max()) > 0
               for t in (xe, w13, w2))
