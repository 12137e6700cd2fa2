"""Training throughput on one GPU: stock PyTorch bf16 vs our step (reference backend, Triton backend), one run.

    python3 benchmarks/train_throughput.py [--layers 4] [--seq-len 2048] [--batch 4] [--accum 1] [--steps 5] [--arms ...]
                                           [--head-slices 3 [2 ...]] [--rotate cuda [triton]] [--clocks] [--run-len 4]

The shape is a proxy of open-1b (report table 2): the same per-layer shapes (d 2048, 16/4 heads x 128,
FFN 5632, vocab 128,256, sliding window 512 with a global layer every 5th and last) and fewer layers.
Every arm trains on the same token ids (random, seeded: speed does not depend on their values).

- `stock`: benchmarks/stock_model.py in float32 masters under bf16 autocast, `torch.compile`, fused AdamW,
  clip_grad_norm_: what a lab would run without our contract, once per attention of `--stock-attention` (rows
  `stock/sdpa`: SDPA with the sliding-window mask; `stock/flex`: flex attention with a sliding-window block mask,
  which skips the tiles outside the window; `stock/mixed`: flex on the windowed layers, SDPA's causal flash kernel
  on the global ones). The ratios are against the fastest of them in this run (`best stock`);
- `ref`, `triton`: training.step.run_step (int8 QAT linears, BR attention and loss, exact reduction, clip,
  AdamW on bf16 masters, stage digests) through kernels.ref or the Triton twins, plus the state hash
  (on the GPU, kernels/triton/statehash.py), i.e. everything the trainer does per step but the log write;
- `triton-nohash`: the Triton arm with stage digests off and no state hash. Hashing's share of the step is
  1 - (triton-nohash step / triton step), measured, not summed from host timers (a digest's host timer would
  also count the queued GPU work it waits for);
- `triton-statehash`: stage digests off, the state hash on (params, m, v, grads, RNG and data cursor): the
  state hash's own share, 1 - (triton-nohash step / triton-statehash step). It hashes four model-sized tensor
  sets; the stage digests add the partial gradients (one set per window) and clipped ones if clipping
  scaled them, the rest they share with the state hash (kernels/digest.DigestMemo).

Our hashing arms also time their hashing inside each step, in the same steps as the step time: the state
hash as the GPU time between CUDA events recorded around it (it runs after the step's kernels on their
stream, so nothing else runs between), the stage digests as the trainer counts them (training/step._HashClock,
events around each queued batch): `state_share_events`, `hash_share_events` (median over the timed steps of
hash / step). They count the hashing's GPU time (and any launch gaps inside it), not what it adds to the
step: hash kernels queued ahead of a host-bound stretch of the step run in GPU time that would otherwise idle.
- `triton-paired`: what hashing adds, without the ~3 ms spread between separately run arms: one process, one
  state, rounds of three steps on the same tokens (no hashing, the state hash only, everything: the trainer's
  step); `state_share_paired` and `hash_share_paired` are the medians over the rounds of 1 - t(no hashing) /
  t(arm) within a round. `--clocks` adds nvidia-smi's SM clock and power (benchmarks/gpu_clocks.py), medians
  over each mode's steps and over the state hash inside them.
- `triton-pipelined`: the same three modes' cost as the trainer runs steps, one after another with no
  synchronization between them: rounds of `--run-len` consecutive steps per mode, timed from an idle GPU to
  an idle GPU (the modes' order turns with each round): no hashing; the state hash read at once after each step
  (`state_hash`, as `triton-statehash`); the state hash queued at the step's end and read after the next step
  is queued (training/deferred_hash.py, the trainer's order), so the host's share of it runs beside the GPU's next
  step. `state_share_sync` and `state_share_deferred` are the medians over the rounds of 1 - t(no hashing) /
  t(mode). Stage digests off in all three.

`--head-slices`: our arms run once per slice count of the LM head's contractions (`model.head_slices`, 3 by
default; an arm at another count is named e.g. `triton/head2`): a different contract, with its own bits and
errors (docs/perf.md), timed beside the default one.

`--rotate`: our arms once per rotate-quantize implementation: `cuda` (the backend's default where NVRTC builds
kernels/cuda/rotate_quantize.cu) and `triton` (its Triton kernel everywhere, named e.g. `triton/rotate-triton`).
Both give the same bits; the pair is the CUDA kernels' gain in the step, in one run.

A step is `--accum` microbatches of `--batch` windows (gradient accumulation, as the report's protocol:
OPEN-1B ran 4 windows of 4,096 tokens per microbatch, 6 microbatches per GPU per step in its main phase);
hashing is per optimizer step, so its share falls as the step grows. Ours computes each window's gradient on its
own (training/windows.py), so a step of several windows sums that many exact partials whatever the cut.

MFU counts 6 x (non-embedding parameters) plus the attention matmuls (fwd + bwd, causal and windowed key
counts) per token against the H200's dense bf16 peak (989 TFLOP/s). Prints a table, writes JSON
(benchmarks/results/train_throughput.json).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.config import ModelConfig, Topology  # noqa: E402
from training.presets import OPEN_1B  # noqa: E402
from kernels.cuda import rotate as cuda_rotate  # noqa: E402

PEAK_BF16 = 989.4e12  # H200 SXM dense bf16 tensor-core peak, FLOP/s
ARMS = ("stock", "ref", "triton", "triton-nohash", "triton-statehash", "triton-paired", "triton-pipelined")


def proxy(layers: int, seq_len: int) -> ModelConfig:
    return OPEN_1B.replace(**{"model.n_layers": layers, "model.seq_len": seq_len}).model


def flops_per_token(c: ModelConfig) -> float:
    """6 N (matmul weights incl. the head, no embedding) + the attention matmuls, forward and backward."""
    d, hd, hq, hkv = c.d_model, c.head_dim, c.n_heads, c.n_kv_heads
    per_layer = d * (hq + 2 * hkv) * hd + hq * hd * d + d * 2 * c.ffn_hidden + c.ffn_hidden * d
    dense = 6 * (c.n_layers * per_layer + d * c.vocab_size)
    attn = 0.0
    for i in range(c.n_layers):
        w = c.window_of(i)
        keys = sum(min(t + 1, w or t + 1) for t in range(c.seq_len)) / c.seq_len  # mean keys per query
        attn += 3 * 2 * 2 * hq * hd * keys  # QK^T and P.V, 2 FLOP per MAC, x3 for forward + backward
    return dense + attn


def token_batches(c: ModelConfig, batch: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, c.vocab_size, (batch, c.seq_len + 1), generator=g, dtype=torch.int64).cuda()
            for _ in range(n)]


def _seconds(fn, *args) -> float:
    """Wall seconds of fn(*args) with the GPU idle before and after."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def _timed(fn, batches: list[torch.Tensor], warmup: int) -> dict:
    torch.cuda.reset_peak_memory_stats()
    times = [_seconds(fn, b) for b in batches][warmup:]
    return {"step_s": statistics.median(times), "step_times": times,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def bench_stock(c: ModelConfig, batches, warmup: int, accum: int, attention: str) -> dict:
    from benchmarks.stock_model import StockModel

    torch.manual_seed(0)
    model = StockModel(c, attention).cuda().prepare(c.seq_len)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model)

    def step(ids):
        for micro in ids.chunk(accum):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fwd(micro)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    out = _timed(step, batches, warmup)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return out


def setup_ours(c: ModelConfig, batch: int, accum: int, backend: str, stage: bool):
    """(step context, fresh state, code version, config JSON) of our step on the proxy, on the GPU."""
    from training.init import init_params
    from training.state_hash import canonical_json, code_version
    from training.step import StepContext, TrainState

    cfg = OPEN_1B.replace(**{"model": c, "train.micro_batch": batch, "train.batch_phases": ((1 << 50, batch * accum),),
                             "train.heldout_windows": 0, "train.stage_digests": stage})
    ctx = StepContext.build(cfg, "cuda", backend=backend)
    st = TrainState.fresh(init_params(c, cfg.train.seed, ctx.device))
    return ctx, st, code_version(), canonical_json(cfg.to_dict()).decode()


def bench_ours(c: ModelConfig, batch: int, accum: int, batches, warmup: int, backend: str, stage: bool = True,
               hashing: bool = True) -> dict:
    """One of our arms: stage digests on or off, the state hash on or off."""
    from training.state_hash import state_entries, state_hash
    from training.step import run_step

    ctx, st, code, cj = setup_ours(c, batch, accum, backend, stage)
    spans: list = []  # per step: (stage digests' seconds, events around the state hash)

    def step(ids):
        r = run_step(st, ids, Topology(), ctx)
        if hashing:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            state_hash(state_entries(st, cj, code, {"window": st.step}), r.memo)
            b.record()
            spans.append((r.digest_seconds, a, b))

    out = _timed(step, batches, warmup)
    if hashing:  # _timed synchronized after every step: the events are done
        timed = spans[warmup:] if stage else [(0.0, a, b) for _, a, b in spans[warmup:]]  # (no stage digests: its
        # digest_seconds is only the host's wait for the step's tail)
        state_s = [a.elapsed_time(b) * 1e-3 for _, a, b in timed]
        out.update(state_hash_s=statistics.median(state_s), digest_s=statistics.median(d for d, _, _ in timed),
                   state_share_events=statistics.median(s / t for s, t in zip(state_s, out["step_times"])),
                   hash_share_events=statistics.median((s + d) / t for s, (d, _, _), t
                                                       in zip(state_s, timed, out["step_times"])))
    del st, ctx
    torch.cuda.empty_cache()
    return out


def bench_paired(c: ModelConfig, batch: int, accum: int, batches, warmup: int, backend: str,
                 clocks: bool = False) -> dict:
    """`triton-paired` (module doc): rounds of no hashing, the state hash only, everything, on one state.
    `clocks`: the SM clock and power over each mode's steps and over the state hash inside them (gpu_clocks)."""
    from training.state_hash import state_entries, state_hash
    from training.step import run_step
    from benchmarks.gpu_clocks import ClockLog, no_spans

    ctx, st, code, cj = setup_ours(c, batch, accum, backend, stage=True)
    quiet = dataclasses.replace(ctx, cfg=ctx.cfg.replace(**{"train.stage_digests": False}))
    modes = {"nohash": (quiet, False), "statehash": (quiet, True), "full": (ctx, True)}

    log = ClockLog() if clocks else None
    span = log.span if log else no_spans

    def step(ids, mode):
        cx, hashing = modes[mode]
        r = run_step(st, ids, Topology(), cx)
        if hashing:
            with span(f"{mode}: the state hash"):
                state_hash(state_entries(st, cj, code, {"window": st.step}), r.memo)

    def seconds(ids, mode):
        with span(mode):
            return _seconds(step, ids, mode)

    torch.cuda.reset_peak_memory_stats()
    rounds = [{mode: seconds(ids, mode) for mode in modes} for ids in batches][warmup:]
    med = {m: statistics.median(r[m] for r in rounds) for m in modes}
    out = {"step_s": med["full"], "nohash_s": med["nohash"], "statehash_s": med["statehash"],
           "state_share_paired": statistics.median(1 - r["nohash"] / r["statehash"] for r in rounds),
           "hash_share_paired": statistics.median(1 - r["nohash"] / r["full"] for r in rounds),
           "rounds": rounds, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    if log:
        out["clocks"] = log.stop()  # the warmup rounds' spans included
        for name, s in out["clocks"].items():
            print(f"  clocks, {name}: {s}", flush=True)
    del st, ctx, quiet
    torch.cuda.empty_cache()
    return out


def bench_pipelined(c: ModelConfig, batch: int, accum: int, batches, warmup: int, backend: str,
                    run_len: int) -> dict:
    """`triton-pipelined` (module doc): rounds of `run_len` steps per mode, no synchronization between steps."""
    from training.deferred_hash import StateHashReader, queue_state_hash
    from training.state_hash import state_entries, state_hash
    from training.step import run_step

    ctx, st, code, cj = setup_ours(c, batch, accum, backend, stage=False)
    reader = StateHashReader()
    modes = ("nohash", "sync", "deferred")

    def steps(ids_list, mode):
        pending = None
        for ids in ids_list:
            r = run_step(st, ids, Topology(), ctx)
            if mode == "nohash":
                continue
            entries = state_entries(st, cj, code, {"window": st.step})
            if mode == "sync":
                state_hash(entries, r.memo)
                continue
            queued = queue_state_hash(entries, r.memo)
            if pending is not None:
                reader.read(pending)
            pending = queued
        if pending is not None:
            reader.read(pending)

    torch.cuda.reset_peak_memory_stats()
    rounds = []
    for i in range(len(batches)):
        ids_list = [batches[(i + j) % len(batches)] for j in range(run_len)]
        order = modes[i % 3:] + modes[:i % 3]
        rounds.append({m: _seconds(steps, ids_list, m) / run_len for m in order})
    rounds = rounds[warmup:]
    med = {m: statistics.median(r[m] for r in rounds) for m in modes}
    out = {"step_s": med["deferred"], "nohash_s": med["nohash"], "sync_s": med["sync"], "run_len": run_len,
           "state_share_sync": statistics.median(1 - r["nohash"] / r["sync"] for r in rounds),
           "state_share_deferred": statistics.median(1 - r["nohash"] / r["deferred"] for r in rounds),
           "rounds": rounds, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
    del st, ctx
    torch.cuda.empty_cache()
    return out


def run_arm(arm: str, c: ModelConfig, args, batches) -> dict:
    if arm.startswith("stock/"):
        return bench_stock(c, batches, args.warmup, args.accum, arm.partition("/")[2])
    backend, _, hashing = arm.partition("-")
    if hashing == "paired":
        return bench_paired(c, args.batch, args.accum, batches, args.warmup, backend, args.clocks)
    if hashing == "pipelined":
        return bench_pipelined(c, args.batch, args.accum, batches, args.warmup, backend, args.run_len)
    return bench_ours(c, args.batch, args.accum, batches, args.warmup, backend, stage=not hashing,
                      hashing=hashing != "nohash")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4, help="windows per microbatch")
    ap.add_argument("--accum", type=int, default=1, help="microbatches per optimizer step")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation, autotuning)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--head-slices", nargs="+", type=int, default=[3], help="slice counts of the head (our arms)")
    ap.add_argument("--stock-attention", nargs="+", default=["sdpa", "flex", "mixed"],
                    choices=("sdpa", "flex", "mixed"),
                    help="the stock arm once per attention; ratios are against the fastest (module doc)")
    ap.add_argument("--rotate", nargs="+", default=["cuda"], choices=("cuda", "triton"),
                    help="rotate-quantize implementations for our arms (module doc)")
    ap.add_argument("--run-len", type=int, default=4, help="pipelined arm: consecutive steps per mode and round")
    ap.add_argument("--clocks", action="store_true",
                    help="paired arm: nvidia-smi's SM clock and power over each mode and its state hash")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "train_throughput.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("train_throughput: needs a CUDA GPU", file=sys.stderr)
        return 2
    c = proxy(args.layers, args.seq_len)
    batches = token_batches(c, args.batch * args.accum, args.warmup + args.steps)
    tokens, fpt = args.batch * args.accum * c.seq_len, flops_per_token(c)
    runs = [(f"stock/{att}", None, "cuda") for att in args.stock_attention if "stock" in args.arms] + \
        [(arm, s, rot) for s in args.head_slices for rot in args.rotate for arm in args.arms if arm != "stock"]
    rows = []
    for arm, slices, rot in runs:
        name = (arm if slices in (None, 3) else f"{arm}/head{slices}") + ("" if rot == "cuda" else f"/rotate-{rot}")
        t0 = time.time()
        try:
            with cuda_rotate.triton_only() if rot == "triton" else contextlib.nullcontext():
                r = run_arm(arm, c if slices is None else dataclasses.replace(c, head_slices=slices), args, batches)
        except Exception as e:  # noqa: BLE001 - one failing arm must not hide the others' numbers
            print(f"{name}: failed: {type(e).__name__}: {e}", flush=True)
            rows.append({"arm": name, "error": f"{type(e).__name__}: {e}"})
            continue
        r.update(arm=name, head_slices=slices, tok_s=tokens / r["step_s"], mfu=tokens * fpt / r["step_s"] / PEAK_BF16,
                 wall_s=time.time() - t0)
        rows.append(r)
        print(f"{name}: {r}", flush=True)
    stock = [r for r in rows if r["arm"].startswith("stock/") and "error" not in r]
    base = min(stock, key=lambda r: r["step_s"]) if stock else None  # the best stock arm of this run
    ok = {r["arm"]: r for r in rows if "error" not in r}
    for name, r in ok.items():
        arm, sep, suffix = name.partition("/")
        nohash = "triton-nohash" + sep + suffix
        if arm in ("triton", "triton-statehash") and nohash in ok:
            r["hash_share"] = 1 - ok[nohash]["step_s"] / r["step_s"]
    print(f"\nopen-1b proxy: {c.n_layers} layers, T {c.seq_len}, {args.accum} x {args.batch} windows/step ({tokens:,} tokens), "
          f"{fpt / 1e9:.2f} GFLOP/token; rotate-quantize's CUDA kernels: {cuda_rotate.status()}; best stock arm: "
          f"{base['arm'] if base else '-'}\n")
    print("| arm | step s | tok/s | MFU (bf16 peak) | best stock / arm | hash share (arms) | hash share (events: state "
          "hash + stage digests) | peak GiB |\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['arm']} | failed: {r['error'][:80]} | | | | | | |")
            continue
        ratio = f"{base['tok_s'] / r['tok_s']:.2f}x" if base else "-"
        share = f"{100 * r['hash_share']:.1f}%" if "hash_share" in r else \
            (f"{100 * r['hash_share_paired']:.1f}% (state hash only {100 * r['state_share_paired']:.1f}%), paired"
             if "hash_share_paired" in r else
             f"state hash {100 * r['state_share_deferred']:.1f}% deferred, {100 * r['state_share_sync']:.1f}% read "
             f"at once; pipelined" if "state_share_deferred" in r else "-")
        ev = (f"{100 * r['hash_share_events']:.1f}% ({1e3 * r['state_hash_s']:.1f} + {1e3 * r['digest_s']:.1f} ms)"
              if "hash_share_events" in r else "-")
        print(f"| {r['arm']} | {r['step_s']:.3f} | {r['tok_s']:,.0f} | {100 * r['mfu']:.1f}% | {ratio} | "
              f"{share} | {ev} | {r['peak_gib']:.1f} |")
    meta = {"command": "benchmarks/train_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "layers": c.n_layers, "seq_len": c.seq_len, "batch": args.batch, "accum": args.accum,
            "flops_per_token": fpt, "cuda_rotate": cuda_rotate.status(), "best_stock": base["arm"] if base else None,
            "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(meta, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
