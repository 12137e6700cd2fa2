"""The PV student: projected decode equals the format's decoder bit for bit; BR gradients are right."""
import torch

from kernels.digest import bits_equal
from quant.format import decode
from quant.student import Latent, atom_grad, decode_latent, to_projection


def test_latent_decodes_to_the_format_and_exports_the_same_codes(make_projection):
    p = make_projection(0, e=2, n=32, k=256)
    lats = [Latent.from_projection(p, s) for s in range(2)]
    for s, lat in enumerate(lats):
        assert bits_equal(lat.weight(), decode(p, s))
        assert bits_equal(decode_latent(lat, lat.books, lat.logs), decode(p, s))
    back = to_projection(lats, list(p.experts))
    for name in ("indices", "codebooks"):
        assert torch.equal(getattr(back, name), getattr(p, name))
    assert torch.equal(back.scales.view(torch.uint8), p.scales.view(torch.uint8))


def test_decode_gradient_matches_float_autograd(make_projection):
    p = make_projection(1, e=1, n=16, k=128)
    lat = Latent.from_projection(p, 0)
    g = torch.randn(16, 128, generator=torch.Generator().manual_seed(0))
    b, lg = lat.books.clone().requires_grad_(), lat.logs.clone().requires_grad_()
    (decode_latent(lat, b, lg) * g).sum().backward()
    b2, l2 = lat.books.clone().requires_grad_(), lat.logs.clone().requires_grad_()
    v = b2[0][lat.idx[..., 0]] + b2[1][lat.idx[..., 1]]                      # straight through fp4
    w = v * (torch.exp(l2) * lat.glob).repeat_interleave(16, dim=1).unsqueeze(-1)
    (w.reshape(16, 128) * g).sum().backward()
    assert torch.allclose(b.grad, b2.grad, rtol=1e-4, atol=1e-5 * float(b2.grad.abs().max()))
    assert torch.allclose(lg.grad, l2.grad, rtol=1e-3, atol=1e-4 * float(l2.grad.abs().max()))


def test_atom_grad_is_order_free():
    gen = torch.Generator().manual_seed(1)
    gv = torch.randn(5000, 8, generator=gen)
    a = torch.randint(0, 256, (5000,), generator=gen)
    perm = torch.randperm(5000, generator=gen)
    x, y = atom_grad(gv, a), atom_grad(gv[perm], a[perm])
    assert bits_equal(x, y)
    ref = torch.zeros(256, 8, dtype=torch.float64).index_add_(0, a, gv.double())
    assert float((x.double() - ref).abs().max()) < 1e-5
