"""The bitwise-reproducible (BR) op library.

`kernels.ref` holds the canonical definitions (eager PyTorch from BR-safe primitives only);
`kernels.triton` holds fast twins with the same names and bits. `backend(name)` picks one.
"""
from __future__ import annotations

import importlib
import types

from kernels import ref

BACKENDS = ("ref", "triton")


class _TritonBackend(types.SimpleNamespace):
    """kernels.ref's module layout, each module the Triton twin where one exists (kernels.triton.TWINS)."""

    name = "triton"  # what is_triton reads (a wrapper of the namespace, e.g. a profiler's, forwards it)

    def __getattr__(self, module: str):
        from kernels.triton import TWINS  # lazy: triton is optional (the `gpu` extra)

        if module.startswith("__"):
            raise AttributeError(module)
        pkg = "kernels.triton" if module in TWINS else "kernels.ref"
        mod = importlib.import_module(f"{pkg}.{module}")
        setattr(self, module, mod)
        return mod


def is_triton(ops) -> bool:
    """True for the Triton backend's op namespace (or a wrapper that forwards its `name`)."""
    return getattr(ops, "name", None) == "triton"


def backend(name: str = "ref"):
    """The op namespace of a backend: `backend(name).<module>.<op>`, e.g. backend("triton").rmsnorm.rmsnorm.

    "triton" gives the Triton twin of an op where one exists and the reference op otherwise; a twin
    runs its kernel on CUDA tensors and falls back to the reference elsewhere (same bits either way).
    """
    if name not in BACKENDS:
        raise ValueError(f"kernels.backend: unknown backend {name!r}; expected one of {BACKENDS}")
    if name == "ref":
        return ref
    try:
        import triton  # noqa: F401
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("kernels.backend('triton') needs the triton package "
                                  "(the `gpu` extra: pip install -e .[gpu])") from e
    return _TritonBackend()
