"""Argument validation shared by every op: errors name the op and the argument."""
from __future__ import annotations

import torch


def expect(op: str, arg: str, t, *, dtype=None, ndim=None, shape=None, device=None) -> None:
    """Raise ValueError naming `op` and `arg` unless `t` is a tensor of the stated kind."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: argument {arg!r} must be a torch.Tensor, got {type(t).__name__}")
    dtypes = dtype if isinstance(dtype, tuple) else ((dtype,) if dtype is not None else ())
    if dtypes and t.dtype not in dtypes:
        want = " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{op}: argument {arg!r} must have dtype {want}, got {t.dtype}")
    ndims = ndim if isinstance(ndim, tuple) else ((ndim,) if ndim is not None else ())
    if ndims and t.dim() not in ndims:
        raise ValueError(f"{op}: argument {arg!r} must have {ndims} dims, got shape {tuple(t.shape)}")
    if shape is not None:
        if len(shape) != t.dim() or any(s is not None and s != d for s, d in zip(shape, t.shape)):
            raise ValueError(f"{op}: argument {arg!r} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{op}: argument {arg!r} must be on {device}, got {t.device}")


def same_device(op: str, **tensors: torch.Tensor) -> None:
    """Raise ValueError naming `op` and the odd argument when tensors sit on different devices."""
    items = list(tensors.items())
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.device != first.device:
            raise ValueError(f"{op}: argument {name!r} is on {t.device} but {first_name!r} is on {first.device}")


def check_finite(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Raise ValueError naming the tensor (and its first bad element) if it holds NaN or Inf."""
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        count = int(bad.sum())  # br-ok: int count of a bool mask, for the message only
        raise ValueError(f"tensor {name!r} has {count} non-finite element(s); first at {idx}: {tensor[idx].item()}")
    return tensor
