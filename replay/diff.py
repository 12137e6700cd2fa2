"""The first differing element of two tensors, compared bitwise (integer views, never a tolerance)."""
from __future__ import annotations

import torch

_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def first_difference(name: str, expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    """None if the bits are equal, else a sentence naming the tensor, index and both values (with bits)."""
    e, a = expected.detach().cpu().contiguous(), actual.detach().cpu().contiguous()
    if e.dtype != a.dtype or e.shape != a.shape:
        return f"{name}: expected {e.dtype} {tuple(e.shape)}, replay has {a.dtype} {tuple(a.shape)}"
    ei, ai = e.reshape(-1).view(_INT[e.element_size()]), a.reshape(-1).view(_INT[a.element_size()])
    bad = torch.nonzero(ei != ai)
    if bad.numel() == 0:
        return None
    flat = int(bad[0, 0])
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), e.shape)) if e.dim() else ()
    w = 2 * e.element_size()
    mask = (1 << (8 * e.element_size())) - 1
    ev, av = e.reshape(-1)[flat].item(), a.reshape(-1)[flat].item()
    return (f"{name}{list(idx)}: expected {ev!r} (0x{int(ei[flat]) & mask:0{w}x}), replay {av!r} "
            f"(0x{int(ai[flat]) & mask:0{w}x}); {bad.shape[0]} of {e.numel()} elements differ")


def first_in(prefix: str, expected: dict[str, torch.Tensor], actual: dict[str, torch.Tensor]) -> str | None:
    """The first difference over named tensors in sorted name order."""
    for k in sorted(expected):
        if k not in actual:
            return f"{prefix}/{k}: missing from the replay"
        d = first_difference(f"{prefix}/{k}", expected[k], actual[k])
        if d:
            return d
    return None
