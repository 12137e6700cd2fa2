"""When a twin runs its Triton kernel, and the compile options every launch must carry.

Bit-relevant: every kernel is launched with `enable_fp_fusion=False`, so `a * b + c` stays a rounded
multiply then a rounded add (Triton would otherwise contract it into an FMA: docs/architecture.md,
measured facts), and with `enable_reflect_ftz=False`, so libdevice's float32 div_rn is `div.rn.f32`, not
`div.rn.ftz.f32` (Triton's default flushes subnormals there; the reference keeps them: docs/architecture.md,
contract point 8).
"""
from __future__ import annotations

import functools
import os

import torch

# TRITON_INTERPRET=1 runs kernels on the CPU with numpy: a logic check, never evidence of GPU bits
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# bit-relevant: no FMA contraction (the reference rounds after every * and +), no flushed subnormals
BR_OPTIONS = {"enable_fp_fusion": False, "enable_reflect_ftz": False}


def _interpreter_scalar_index() -> None:
    """Let the interpreter use runtime scalars as loop bounds under numpy >= 2.3 (dev only).

    Its tensors hold scalars as 1-element arrays, which newer numpy refuses to turn into an int.
    """
    from triton.runtime import interpreter

    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


if INTERPRET:
    _interpreter_scalar_index()


def on_triton(*tensors: torch.Tensor | None) -> bool:
    """True when the Triton kernel can take these tensors: all on CUDA (or the interpreter on CPU)."""
    present = [t for t in tensors if t is not None]
    if INTERPRET:
        return all(t.device.type == "cpu" for t in present)
    return bool(present) and all(t.is_cuda for t in present)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def split_spans(total: int, block: int, programs: int = 1024) -> tuple[int, int]:
    """(count, span): `total` elements cut into spans of whole `block`s, at least 4 blocks a span where there
    are enough, into about `programs` programs (free for the bits: the reductions over them are exact)."""
    k = max(1, min(cdiv(total, 4 * block), programs))
    span = cdiv(cdiv(total, k), block) * block
    return cdiv(total, span), span


def pow2_at_least(n: int) -> int:
    """The smallest power of two >= max(n, 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


@functools.lru_cache(maxsize=256)
def constant(fn, *args) -> torch.Tensor:
    """fn(*args), a tensor a twin reads on every call (a scale, a mask), made once per process and arguments.
    Making one on a CUDA device uploads a host value, and a blocking upload waits for every queued kernel: one
    wait a run instead of one a call (the GPU sat idle while the host caught up). Callers never write it."""
    return fn(*args)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; to CUDA from pinned memory, without waiting for the queued kernels."""
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def upload(value: float, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A host scalar as a 0-dim tensor on `device` (rounded to dtype on the host, as torch.tensor does)."""
    return to_device(torch.tensor(value, dtype=dtype), device)
