"""benchmarks/profile_step.py's trace readers: kernels charged to the op that launched them (no GPU needed)."""
from __future__ import annotations

import json

from benchmarks.profile_step import idle_by_range, kernels_by_op

MAIN, AUTOGRAD = 1, 2


def _range(name: str, ts: float, dur: float, tid: int, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def _kernel(name: str, launched_at: float, tid: int, corr: int, dur: float) -> list[dict]:
    """A runtime launch on host thread `tid` and its kernel, linked by the correlation id."""
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launched_at, "dur": 1, "tid": tid,
             "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": name, "ts": 1000 + corr, "dur": dur, "tid": 7,
             "args": {"correlation": corr}}]


def test_kernels_go_to_the_innermost_op_on_their_launching_thread(tmp_path):
    events = [_range("phase:reduce_gradients", 0, 500, MAIN), _range("op:attention.attention", 10, 40, MAIN),
              _range("autograd::engine::evaluate_function: _AttentionBackward", 100, 100, AUTOGRAD, "cpu_op"),
              _range("phase:clip", 600, 100, MAIN), _range("op:reduce.global_l2_norm", 610, 20, MAIN),
              # the GPU-side copy of a range is not a host range
              {"ph": "X", "cat": "gpu_user_annotation", "name": "op:attention.attention", "ts": 0, "dur": 5000,
               "tid": 7}]
    events += _kernel("_pv_kernel", 20, MAIN, 1, 300)
    events += _kernel("_pv_kernel", 30, MAIN, 2, 200)
    events += _kernel("_band_split_kernel", 150, AUTOGRAD, 3, 400)  # inside phase:reduce_gradients in time too
    events += _kernel("_l2_sum_kernel", 620, MAIN, 4, 50)
    events += _kernel("mul", 650, MAIN, 5, 70)  # in the clip phase, in no op
    events += _kernel("copy", 800, MAIN, 6, 10)
    events += _kernel("_result_kernel", 300, MAIN, 7, 20)
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = {r["op"]: r for r in kernels_by_op(trace)}
    assert {op: (r["gpu_ms"], r["launches"]) for op, r in rows.items()} == {
        "op:attention.attention": (0.5, 2), "bwd:_AttentionBackward": (0.4, 1), "op:reduce.global_l2_norm": (0.05, 1),
        "phase:clip": (0.07, 1), "(outside any range)": (0.01, 1), "phase:reduce_gradients": (0.02, 1)}
    assert rows["op:attention.attention"]["kernels"] == [{"kernel": "_pv_kernel", "calls": 2, "gpu_ms": 0.5}]
    assert [r["op"] for r in kernels_by_op(trace)][:2] == ["op:attention.attention", "bwd:_AttentionBackward"]


def test_idle_gaps_go_to_the_range_that_launched_the_next_kernel_on_its_thread(tmp_path):
    """Triton launches through the driver (cuLaunchKernel): their gaps count, charged on the launching thread."""
    events = [_range("phase:clip", 0, 1000, MAIN), _range("op:reduce.global_l2_norm", 100, 300, MAIN),
              _range("autograd::engine::evaluate_function: _AttentionBackward", 0, 1000, AUTOGRAD, "cpu_op")]
    events += _kernel("a", 50, AUTOGRAD, 1, 10)  # kernel at 1001..1011
    events += _kernel("b", 150, MAIN, 5, 4)  # runtime launch; kernel at 1005: overlaps, no gap
    launch, kernel = _kernel("_l2_sum_kernel", 200, MAIN, 20, 5)  # kernel at 1020: a 9 us gap
    launch.update(cat="cuda_driver", name="cuLaunchKernel")
    events += [launch, kernel]
    events += _kernel("mul", 500, MAIN, 40, 5)  # at 1040, 15 us after the last: in the clip phase, no op
    events += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 300, "dur": 7, "tid": MAIN}]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": events}))
    rows = {r["range"]: r for r in idle_by_range(trace)}
    assert {k: (round(r["idle_ms"] * 1e3), r["gaps"], r["syncs"]) for k, r in rows.items()} == {
        "op:reduce.global_l2_norm": (9, 1, 1), "phase:clip": (15, 1, 0)}
