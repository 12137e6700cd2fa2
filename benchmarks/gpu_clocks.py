"""The GPU's SM clock and power draw, sampled by nvidia-smi beside a benchmark, summarized over spans it marks.

CUDA events say how long a kernel took, not at what clock: whether the GPU runs the state hash at a lower clock
inside a step than alone (power capping after the step's tensor-core phases) is a question for the clock (alone,
on an H200, it ran at the maximum 1980 MHz: docs/perf.md). `--clocks` in
benchmarks/train_throughput.py (the paired arm) and benchmarks/state_hash_cost.py uses this.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import os
import statistics
import subprocess
import tempfile
from datetime import datetime

STAMP = "%Y/%m/%d %H:%M:%S.%f"  # nvidia-smi's timestamp, the machine's local time (as datetime.now())


def parse(lines) -> list[tuple[datetime, float, float]]:
    """(time, SM clock MHz, power W) of nvidia-smi's `timestamp,clocks.sm,power.draw` csv lines (noheader,
    nounits); lines it could not read (a sample cut by the stop, [N/A]) are left out."""
    out = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            out.append((datetime.strptime(parts[0], STAMP), float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return out


def summarize(samples, spans: dict[str, list[tuple[datetime, datetime]]]) -> dict[str, dict]:
    """Per span name: how many samples fell inside its spans, and their median SM clock and power."""
    out = {}
    for name, ranges in spans.items():
        inside = [(mhz, w) for t, mhz, w in samples if any(a <= t <= b for a, b in ranges)]
        out[name] = {"samples": len(inside), "spans": len(ranges),
                     "sm_mhz": statistics.median(m for m, _ in inside) if inside else None,
                     "power_w": statistics.median(w for _, w in inside) if inside else None}
    return out


class ClockLog:
    """nvidia-smi sampling the benchmark's GPU every `period_ms` in a subprocess, until `stop`."""

    def __init__(self, period_ms: int = 20):
        gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
        self._out = tempfile.TemporaryFile("w+")
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "-i", gpu, "--query-gpu=timestamp,clocks.sm,power.draw",
                 "--format=csv,noheader,nounits", "-lms", str(period_ms)],
                stdout=self._out, stderr=subprocess.DEVNULL, text=True)
        except FileNotFoundError as e:
            raise RuntimeError("--clocks needs nvidia-smi on PATH") from e
        atexit.register(self._proc.terminate)  # a benchmark that fails before stop() leaves no sampler running
        self.spans: dict[str, list[tuple[datetime, datetime]]] = collections.defaultdict(list)

    @contextlib.contextmanager
    def span(self, name: str):
        start = datetime.now()
        try:
            yield
        finally:
            self.spans[name].append((start, datetime.now()))

    def stop(self) -> dict[str, dict]:
        """Ends the sampling; `summarize` of what it read over the marked spans."""
        self._proc.terminate()
        self._proc.wait()
        self._out.seek(0)
        samples = parse(self._out)
        self._out.close()
        return summarize(samples, self.spans)


def no_spans(name: str):
    """ClockLog.span's stand-in when clocks are not logged."""
    return contextlib.nullcontext()
