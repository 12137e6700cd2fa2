"""The bitwise-reproducible (BR) op library.

`kernels.ref` holds the canonical definitions (eager PyTorch from BR-safe primitives only);
`kernels.triton` will hold fast twins with the same names and bits. `backend(name)` picks one.
"""
from kernels import ref

BACKENDS = ("ref",)


def backend(name: str = "ref"):
    """The op namespace of a backend; only the reference backend exists so far."""
    if name not in BACKENDS:
        raise ValueError(f"kernels.backend: unknown backend {name!r}; expected one of {BACKENDS}")
    return ref
