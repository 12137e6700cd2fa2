"""The device and op backend a run or a replay asks for, refused by name before any work.

Kept out of training/step.py on purpose: that file is in the code version (training/state_hash.CODE_GLOBS), and what is
checked here changes no bit of a run.
"""
from __future__ import annotations

import torch

from training.errors import ConfigError


def run_device(device: torch.device | str) -> torch.device:
    """`device` as a torch.device this machine has: cpu, cuda or cuda:N."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device {device!r}: not a device; expected cpu, cuda or cuda:N") from e
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {device!r}: expected cpu, cuda or cuda:N")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {device!r}: no CUDA device on this machine (torch {torch.__version__}, "
                              f"CUDA build {torch.version.cuda or 'none'})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return dev


def run_backend(name: str):
    """`kernels.backend(name)`; an unknown name or a missing package (triton) is a ConfigError naming it."""
    import kernels

    try:
        return kernels.backend(name)
    except (ValueError, ModuleNotFoundError) as e:
        raise ConfigError(f"backend {name!r}: {e}") from e


def check(device: torch.device | str, backend: str) -> None:
    """Both checks, for a caller about to build a StepContext."""
    run_device(device)
    run_backend(backend)
