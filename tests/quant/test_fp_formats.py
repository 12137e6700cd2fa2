"""FP4 E2M1 and E4M3fn codecs against exhaustive tables, torch's float8 cast and a brute-force nearest-even."""
import numpy as np
import pytest
import torch

from quant.fp_formats import (E4M3_MAX, FP4_VALUES, e4m3_decode, e4m3_encode, fp4_decode, fp4_encode,
                              fp4_round, from_float8_e4m3, to_float8_e4m3)

FP4_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _nearest_even(x: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Index into a sorted non-negative grid nearest |x|; ties to the even index (= even code)."""
    d = np.abs(np.abs(x)[:, None] - grid[None, :])
    best = d.min(axis=1, keepdims=True)
    cand = d == best
    idx = np.argmax(cand, axis=1)
    two = cand.sum(axis=1) > 1
    idx[two & (idx % 2 == 1)] += 1  # tie: the two candidates are consecutive codes; take the even one
    return idx


def test_fp4_all_16_codes():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = fp4_decode(codes)
    want = torch.tensor(FP4_TABLE + [-v for v in FP4_TABLE])
    assert torch.equal(vals.view(torch.int32), want.view(torch.int32))  # -0.0 for code 8, bit for bit
    assert tuple(FP4_VALUES) == tuple(FP4_TABLE)
    assert torch.equal(fp4_encode(vals), codes)


def test_fp4_ties_saturation_nan():
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, 1e30, float("inf"), -5.0, -0.25, 2**-140])
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 6.0, -4.0, -0.0, 0.0])
    assert torch.equal(fp4_round(x).view(torch.int32), want.view(torch.int32))
    with pytest.raises(ValueError, match="NaN"):
        fp4_encode(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match="float32"):
        fp4_encode(torch.tensor([1.0], dtype=torch.float64))


def test_fp4_dense_sweep_matches_brute_force():
    grid = np.array(FP4_TABLE, dtype=np.float32)
    mids = (grid[1:] + grid[:-1]) / 2
    x = np.concatenate([np.linspace(-8, 8, 20001, dtype=np.float32), mids, -mids,
                        np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(9))]).astype(np.float32)
    idx = _nearest_even(x, grid)
    want = np.where(np.signbit(x), -grid[idx], grid[idx]).astype(np.float32)
    got = fp4_round(torch.from_numpy(x)).numpy()
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


def test_e4m3_all_256_codes_match_torch():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    ours = e4m3_decode(codes)
    theirs = codes.view(torch.float8_e4m3fn).to(torch.float32)
    nan = torch.isnan(theirs)
    assert torch.equal(nan, torch.isnan(ours)) and int(nan.sum()) == 2  # 0x7F, 0xFF
    assert torch.equal(ours[~nan].view(torch.int32), theirs[~nan].view(torch.int32))
    assert e4m3_decode(torch.tensor([0x7E], dtype=torch.uint8)).item() == E4M3_MAX == 448.0
    finite = codes[~nan]
    assert torch.equal(e4m3_encode(ours[~nan]), finite)  # encode(decode(c)) == c, -0 included


def test_e4m3_midpoints_and_neighbours_match_torch_cast():
    vals = e4m3_decode(torch.arange(0, 0x7F, dtype=torch.int64).to(torch.uint8))  # 0 .. 448
    mids = (vals[1:] + vals[:-1]) / 2  # exact in float32
    x = torch.cat([mids, torch.nextafter(mids, torch.zeros_like(mids)), torch.nextafter(mids, mids + 1), vals])
    x = torch.cat([x, -x])
    assert torch.equal(e4m3_encode(x), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_e4m3_random_wide_range_matches_torch_cast():
    g = torch.Generator().manual_seed(3)
    mag = torch.exp2(torch.rand(200_000, generator=g) * 24 - 14)  # 2^-14 .. 2^10: subnormals to overflow
    sgn = torch.where(torch.rand(200_000, generator=g) < 0.5, -1.0, 1.0)
    x = (mag * sgn).to(torch.float32)
    x = x[x.abs() <= 464]  # torch saturates beyond; checked separately below
    assert torch.equal(to_float8_e4m3(x).view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))
    assert torch.equal(from_float8_e4m3(to_float8_e4m3(x)), x.to(torch.float8_e4m3fn).to(torch.float32))


def test_e4m3_saturation_and_nan():
    x = torch.tensor([448.0, 464.0, 464.1, 1e9, float("inf"), -float("inf"), float("nan"), -float("nan"), 2**-10,
                      3 * 2**-10, 2**-149])
    assert e4m3_encode(x).tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0xFF, 0x00, 0x02, 0x00]
    assert e4m3_encode(x, saturate=False).tolist()[:6] == [0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0xFF]
