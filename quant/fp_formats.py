"""FP4 E2M1 and FP8 E4M3 (fn) encode/decode from float32 bits in integer ops: round to nearest even.

Both are minifloats [sign | exponent | mantissa]. Encoding reads the float32 bits: in the normal range
the exponent and mantissa shift down together (a mantissa carry rolls into the exponent for free); below
the smallest normal the value is an integer multiple of the subnormal quantum. Integer ops only, so the
codes are the same on every CPU and GPU.

- E2M1: bias 1, values {0, 0.5, 1, 1.5, 2, 3, 4, 6}; no Inf/NaN: overflow and Inf saturate to +-6, NaN
  is refused (there is nothing to encode it to).
- E4M3fn: bias 7, max 448, no Inf; code 0x7F is NaN. NaN keeps its sign (0x7F/0xFF); overflow and Inf
  saturate to +-448 like torch's cast (or become NaN with saturate=False, the OCP "non-saturating" mode).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

F32 = torch.float32


@dataclass(frozen=True)
class Minifloat:
    name: str
    exp_bits: int
    man_bits: int
    bias: int
    max_code: int           # largest finite magnitude code
    nan_code: int | None    # magnitude code of NaN, if the format has one

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal."""
        return 1 - self.bias

    def magnitude(self, code: int) -> float:
        """The value of a magnitude code (exact: a small integer times a power of two)."""
        e, f = code >> self.man_bits, code & ((1 << self.man_bits) - 1)
        if e == 0:
            return f * 2.0 ** (self.emin - self.man_bits)
        return ((1 << self.man_bits) + f) * 2.0 ** (e - self.bias - self.man_bits)


E2M1 = Minifloat("fp4_e2m1", 2, 1, 1, 0x7, None)
E4M3 = Minifloat("fp8_e4m3fn", 4, 3, 7, 0x7E, 0x7F)
FP4_VALUES = tuple(E2M1.magnitude(c) for c in range(8))  # (0, 0.5, 1, 1.5, 2, 3, 4, 6)
E4M3_MAX = E4M3.magnitude(E4M3.max_code)                  # 448.0


def _rne_shift(v: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """round(v / 2^s) half to even, for int64 v >= 0 and s >= 1."""
    q = v >> s
    rem = v - (q << s)
    half = torch.ones_like(v) << (s - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    return q + up.to(torch.int64)


def _as_f32(op: str, x: torch.Tensor) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dtype not in (F32, torch.float16, torch.bfloat16):
        got = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        # float64 would round twice (to float32, then to the minifloat): refuse it rather than guess
        raise ValueError(f"{op}: argument 'x' must be a float32/float16/bfloat16 tensor, got {got}")
    return x.to(F32)


def _encode(fmt: Minifloat, x: torch.Tensor, saturate: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sign bit, magnitude code, is-NaN mask) as int64/bool tensors for float32 x."""
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    sign = (bits >> 31) & 1
    a = bits & 0x7FFFFFFF
    e32, m32 = a >> 23, a & 0x7FFFFF
    nan = a > 0x7F800000
    # normal range: exponent and mantissa round together, rebias the exponent
    normal = _rne_shift(a, torch.full_like(a, 23 - fmt.man_bits)) - ((127 - fmt.bias) << fmt.man_bits)
    # below the smallest normal: an integer multiple of the quantum 2^(emin - man_bits)
    mant = torch.where(e32 > 0, m32 | 0x800000, m32)
    unb = torch.where(e32 > 0, e32 - 127, torch.full_like(e32, -126))
    shift = torch.clamp(23 + fmt.emin - fmt.man_bits - unb, min=1, max=40)
    sub = _rne_shift(mant, shift)
    code = torch.where(e32 - 127 >= fmt.emin, normal, sub)
    over = code > fmt.max_code
    if saturate or fmt.nan_code is None:
        code = torch.where(over, torch.full_like(code, fmt.max_code), code)
    else:
        code = torch.where(over, torch.full_like(code, fmt.nan_code), code)
    return sign, code, nan


def _table(fmt: Minifloat, device) -> torch.Tensor:
    vals = [fmt.magnitude(c) for c in range(1 << (fmt.exp_bits + fmt.man_bits))]
    if fmt.nan_code is not None:
        vals[fmt.nan_code] = float("nan")
    return torch.tensor(vals, dtype=F32, device=device)


def fp4_encode(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 in 0..15, bit 3 = sign) of x, nearest even; |x| > 6 and Inf saturate; NaN raises."""
    x = _as_f32("fp4_encode", x)
    sign, code, nan = _encode(E2M1, x, True)
    if bool(nan.any()):
        idx = tuple(int(i) for i in torch.nonzero(nan)[0])
        raise ValueError(f"fp4_encode: E2M1 has no NaN; input holds NaN at {idx}")
    return ((sign << 3) | code).to(torch.uint8)


def fp4_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of E2M1 codes (uint8, low 4 bits used); code 8 is -0.0."""
    c = codes.to(torch.int64)
    mag = _table(E2M1, c.device)[c & 0x7]
    return torch.where((c & 0x8) != 0, -mag, mag)


def fp4_round(x: torch.Tensor) -> torch.Tensor:
    """x projected onto the FP4 grid {0, +-0.5, ..., +-6} (nearest, ties to even code)."""
    return fp4_decode(fp4_encode(x))


def e4m3_encode(x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
    """E4M3fn codes (uint8) of x, nearest even; NaN -> 0x7F with x's sign; overflow/Inf -> +-448 or NaN."""
    x = _as_f32("e4m3_encode", x)
    sign, code, nan = _encode(E4M3, x, saturate)
    code = torch.where(nan, torch.full_like(code, E4M3.nan_code), code)
    return ((sign << 7) | code).to(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of E4M3fn codes (uint8); 0x7F/0xFF decode to NaN."""
    c = codes.to(torch.int64)
    mag = _table(E4M3, c.device)[c & 0x7F]
    return torch.where((c & 0x80) != 0, -mag, mag)


def to_float8_e4m3(x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
    """x as a torch.float8_e4m3fn tensor (our encoder's bits, viewed)."""
    return e4m3_encode(x, saturate).view(torch.float8_e4m3fn)


def from_float8_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float32 values of a torch.float8_e4m3fn tensor (through our table, not torch's cast)."""
    if x.dtype != torch.float8_e4m3fn:
        raise ValueError(f"from_float8_e4m3: argument 'x' must be float8_e4m3fn, got {x.dtype}")
    return e4m3_decode(x.view(torch.uint8))


def e4m3_round(x: torch.Tensor, saturate: bool = True) -> torch.Tensor:
    """x rounded to the nearest E4M3fn value (float32)."""
    return e4m3_decode(e4m3_encode(x, saturate))
