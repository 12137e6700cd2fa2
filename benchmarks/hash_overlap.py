"""The state hash beside the next step: on the step's own stream (as now) vs on a second CUDA stream, one run.

    python3 benchmarks/hash_overlap.py [--layers 4] [--seq-len 2048] [--batch 4] [--steps 8] [--warmup 2]

The step is GPU-bound (benchmarks/profile_step.py: ~91% busy), so a hash that is only moved to the end of the
queue still costs its ~8 ms. BLAKE3 is integer-ALU work; the step's largest kernels are int8 tensor-core GEMMs
and latency-bound row kernels, which leave the ALUs idle. This measures whether the hash, queued on a second
stream, runs in those holes. Arms (Triton backend, open-1b proxy, stage digests off):

- `nohash`: run_step alone;
- `serial`: run_step, then the state hash's tensor digests queued on the step's stream and read (the trainer);
- `side`: step t's tensor digests queued on a second stream when step t is queued, read after step t + 1;
  step t + 1's AdamW (the only writer of params, m, v; grads are replaced, not written) waits for them on an
  event, so the hashed bytes are step t's.

Every step's state hash of `side` is compared with `serial`'s (same init, same batches). Times are the wall
time of all timed steps with one synchronize at the end, divided by the steps (a synchronize per step would
wait for the second stream too). Prints a table, writes JSON (benchmarks/results/hash_overlap.json).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.config import Topology  # noqa: E402
from benchmarks.train_throughput import proxy, setup_ours, token_batches  # noqa: E402

ARMS = ("nohash", "serial", "side")


def _tensors_and_finish(st, cj, code):
    """The state's tensors in the hash's order, and a function of their raw digests giving the state hash."""
    from app.state_hash import state_entries, state_hash

    entries = state_entries(st, cj, code, {"window": st.step})
    names = sorted(entries, key=lambda s: s.encode())
    tensors = [entries[k] for k in names if isinstance(entries[k], torch.Tensor)]

    class Given:  # a DigestMemo that already knows every digest
        def __init__(self, raw):
            self.raw = raw

        def digests(self, ts):
            return self.raw

    return tensors, lambda raw: state_hash(entries, Given(raw))


def run_arm(arm: str, c, batch: int, batches, warmup: int) -> dict:
    import app.step as step_mod
    from kernels.triton import statehash

    ctx, st, code, cj = setup_ours(c, batch, 1, "triton", stage=False)
    hashes: list[bytes] = []
    side = torch.cuda.Stream()
    pending: list = []  # (event, rows, finish, tensors held until read)
    plain_update = step_mod.adamw_update

    def update_after_hash(*a, **kw):
        if pending:  # the previous state's digests must have read params, m, v before they change
            torch.cuda.current_stream().wait_event(pending[-1][0])
        return plain_update(*a, **kw)

    def read_pending():
        ev, rows, finish, _ = pending.pop(0)
        with torch.cuda.stream(side):
            host = rows.cpu().numpy().astype("<i4")
        hashes.append(finish([host[i].tobytes() for i in range(len(host))]))

    step_mod.adamw_update = update_after_hash if arm == "side" else plain_update
    try:
        t0 = None
        for i, ids in enumerate(batches):
            if i == warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            step_mod.run_step(st, ids, Topology(), ctx)
            if arm == "nohash":
                continue
            tensors, finish = _tensors_and_finish(st, cj, code)
            if arm == "serial":
                host = statehash.queue_digests(tensors).cpu().numpy().astype("<i4")
                hashes.append(finish([host[j].tobytes() for j in range(len(host))]))
                continue
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                rows = statehash.queue_digests(tensors)
                ev = torch.cuda.Event()
                ev.record(side)
            pending.append((ev, rows, finish, tensors))
            if len(pending) > 1:
                read_pending()
        while pending:
            read_pending()
        torch.cuda.synchronize()
        step_s = (time.perf_counter() - t0) / (len(batches) - warmup)
    finally:
        step_mod.adamw_update = plain_update
    del st, ctx
    torch.cuda.empty_cache()
    return {"arm": arm, "step_s": step_s, "hashes": [h.hex() for h in hashes]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hash_overlap.json"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("hash_overlap: needs a CUDA GPU", file=sys.stderr)
        return 2
    c = proxy(args.layers, args.seq_len)
    batches = token_batches(c, args.batch, args.warmup + args.steps)
    rows = {}
    for arm in args.arms:
        rows[arm] = run_arm(arm, c, args.batch, batches, args.warmup)
        print(f"{arm}: {rows[arm]['step_s']:.4f} s/step", flush=True)
    same = None
    if "serial" in rows and "side" in rows:
        same = rows["serial"]["hashes"] == rows["side"]["hashes"]
    base = rows.get("nohash")
    print("\n| arm | step s | state hash share (1 - nohash / arm) | hashes as serial's |\n| --- | --- | --- | --- |")
    for arm, r in rows.items():
        share = f"{100 * (1 - base['step_s'] / r['step_s']):.1f}%" if base and arm != "nohash" else "-"
        eq = "-" if arm != "side" or same is None else ("yes" if same else "NO")
        print(f"| {arm} | {r['step_s']:.4f} | {share} | {eq} |")
    meta = {"command": "benchmarks/hash_overlap.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "gpu": torch.cuda.get_device_name(),
            "layers": c.n_layers, "seq_len": c.seq_len, "batch": args.batch, "steps": args.steps,
            "side_hashes_equal_serial": same, "rows": list(rows.values())}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(meta, indent=1))
    print(f"wrote {args.out}")
    return 0 if same in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
