"""rvq256_256x8: decoding by definition, exact round trips, bits/weight accounting."""
import pytest
import torch

from quant.errors import FormatError
from quant.format import RVQProjection, bits_per_weight, decode, decode_all
from quant.fp_formats import fp4_decode, fp4_encode, to_float8_e4m3


def test_decode_is_the_definition(make_projection):
    p = make_projection(seed=1, e=2, n=16, k=256)
    w = decode(p, 1)
    r, g = 5, 19
    a, b = p.indices[1, r, g].long()
    atoms = fp4_decode(p.codebooks[1])
    s = (p.scales[1, r, g // 16].float() * p.global_scale)
    want = (atoms[0, a] + atoms[1, b]) * s
    assert torch.equal(w[r, 8 * g: 8 * g + 8].view(torch.int32), want.view(torch.int32))
    assert decode_all(p).shape == (2, 16, 256)


def test_encode_decode_round_trip_exact(make_projection):
    """Re-encoding the decoded pieces (atoms to FP4, scales to E4M3) gives back the same codes."""
    p = make_projection(seed=2, e=3, n=16, k=384)
    q = RVQProjection(codebooks=fp4_encode(fp4_decode(p.codebooks)), indices=p.indices.clone(),
                      scales=to_float8_e4m3(p.scales.float()), global_scale=p.global_scale.clone(),
                      experts=p.experts)
    assert torch.equal(q.codebooks, p.codebooks)
    assert torch.equal(q.scales.view(torch.uint8), p.scales.view(torch.uint8))
    assert torch.equal(decode_all(q).view(torch.int32), decode_all(p).view(torch.int32))


def test_bits_per_weight_glm_shapes():
    w13 = bits_per_weight(4096, 6144, experts=1)
    assert w13["indices"] == 2.0 and w13["scales"] == 0.0625
    assert w13["codebooks"] == 2 * 256 * 8 * 4 / (4096 * 6144)
    assert w13["total"] == pytest.approx(2.0625 + 16384 / (4096 * 6144) + 32 / (4096 * 6144), rel=1e-15)
    w2 = bits_per_weight(6144, 2048, experts=178)
    assert w2["total"] == pytest.approx(2.0625 + 16384 / (6144 * 2048) + 32 / (178 * 6144 * 2048), rel=1e-15)


def test_validation_names_the_tensor(make_projection):
    p = make_projection()
    with pytest.raises(FormatError, match="scales"):
        RVQProjection(p.codebooks, p.indices, p.scales[:, :, :1], p.global_scale, p.experts)
    with pytest.raises(FormatError, match="K a multiple of 128"):
        RVQProjection(p.codebooks, p.indices[:, :, :8], p.scales, p.global_scale, p.experts)
    with pytest.raises(FormatError, match="experts"):
        RVQProjection(p.codebooks, p.indices, p.scales, p.global_scale, (0, 0))
