"""One GPU, many pytest workers: a test that runs out of device memory beside the others is run again alone.

`python3 -m pytest tests/gpu -n 14` puts 14 processes on one GPU. On an 80 GiB H100 the large cases of several
workers at once (and what each worker's caching allocator keeps) can exceed the device: on 2026-12-06 two runs
of test_triton_parity.py + test_statehash.py there failed 9 and 5 tests, every one with CUDA's out-of-memory
error and none with a wrong bit. Such an `F` says nothing about the kernels, and a bit-identity suite should
not need one explained away. So, under xdist, each test runs holding a shared lock and returns its cached
memory when done; a test that raises CUDA's out-of-memory error runs once more holding the lock exclusively
(new tests wait, running ones finish first), and then passes or fails on its own. A rerun is reported as a
warning in the run's summary. Without xdist nothing changes: a test alone on the device gets no second try.
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import tempfile
import warnings
from pathlib import Path

import pytest
import torch

_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of one run; unset without xdist
_locks: tuple[int, int] | None = None


def out_of_device_memory(e: BaseException) -> bool:
    """CUDA's out-of-memory error, as torch's allocator or a Triton module load raises it."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and "CUDA" in text and "out of memory" in text


def _lock_files() -> tuple[int, int]:
    """(gate, room): the gate orders entries so that an exclusive rerun is not starved by a stream of tests."""
    global _locks
    if _locks is None:
        d = Path(tempfile.gettempdir()) / f"tests-gpu-{_RUN}"
        d.mkdir(exist_ok=True)
        _locks = tuple(os.open(d / name, os.O_RDWR | os.O_CREAT, 0o600) for name in ("gate", "room"))
    return _locks


@contextlib.contextmanager
def _holding(exclusive: bool):
    gate, room = _lock_files()
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        fcntl.flock(room, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    finally:
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        yield
    finally:
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # what this test freed goes back to the device, for a rerun waiting alone
        fcntl.flock(room, fcntl.LOCK_UN)
        if exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if _RUN is None:
        return None  # pytest's own call
    fn = pyfuncitem.obj
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    failed = None
    with _holding(exclusive=False):
        try:
            fn(**args)
        except Exception as e:  # noqa: BLE001 - anything but running out of memory is re-raised at once
            if not out_of_device_memory(e):
                raise
            failed = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    if failed is None:
        return True
    warnings.warn(f"{pyfuncitem.nodeid}: out of device memory beside other workers ({failed}); run again alone",
                  stacklevel=1)
    with _holding(exclusive=True):
        fn(**args)
    return True
