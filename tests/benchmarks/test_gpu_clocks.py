"""benchmarks/gpu_clocks.py: nvidia-smi's samples read and summarized over a benchmark's spans (no GPU needed)."""
from __future__ import annotations

from datetime import datetime, timedelta

from benchmarks.gpu_clocks import parse, summarize

T0 = datetime(2026, 12, 3, 21, 0, 0)


def _line(ms: int, mhz: str, watts: str) -> str:
    return f"{(T0 + timedelta(milliseconds=ms)).strftime('%Y/%m/%d %H:%M:%S.%f')[:-3]}, {mhz}, {watts}\n"


def test_samples_are_read_and_unreadable_lines_left_out():
    lines = [_line(0, "1980", "350.12"), _line(20, "[N/A]", "351.00"), "2026/12/03 21:00:00.0", _line(40, "1755", "690.5")]
    assert parse(lines) == [(T0, 1980.0, 350.12), (T0 + timedelta(milliseconds=40), 1755.0, 690.5)]


def test_each_span_name_gets_the_median_of_the_samples_inside_its_spans():
    samples = parse([_line(ms, mhz, w) for ms, mhz, w in
                     [(0, "1980", "300"), (20, "1600", "700"), (40, "1500", "690"), (60, "1980", "310"),
                      (80, "1700", "650"), (100, "1980", "305")]])
    at = lambda ms: T0 + timedelta(milliseconds=ms)  # noqa: E731
    got = summarize(samples, {"step": [(at(15), at(45)), (at(75), at(85))], "hash": [(at(50), at(55))]})
    assert got["step"] == {"samples": 3, "spans": 2, "sm_mhz": 1600.0, "power_w": 690.0}
    assert got["hash"] == {"samples": 0, "spans": 1, "sm_mhz": None, "power_w": None}
