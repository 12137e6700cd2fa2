"""Timing a layer's phases one by one (benchmarks/attention_phases.py, benchmarks/linear_phases.py)."""
from __future__ import annotations


def time_phases(steps, whole, rep: int) -> tuple[list[dict], float, float]:
    """([{"phase", "ms"}] for each (phase, fn, ...) of `steps`, the whole fn's ms, the phases' summed ms): each the
    median of triton.testing.do_bench, so the sum beside the whole shows what the phases leave out."""
    from triton.testing import do_bench
    rows = [dict(phase=s[0], ms=do_bench(s[1], warmup=2, rep=rep, return_mode="median")) for s in steps]
    total = do_bench(whole, warmup=2, rep=rep, return_mode="median")
    return rows, total, sum(r["ms"] for r in rows)
