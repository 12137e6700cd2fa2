"""AdamW and the state hash's tensor digests at open-1b's parameter set: separate passes vs one fused kernel.

    python3 benchmarks/adamw_hash.py [--layers 24] [--out benchmarks/results/adamw_hash.json]

Every parameter of the open-1b shape (with --layers layers) with its float32 gradient and moments, on one GPU.
Timed side by side in one run (CUDA graphs are not used: each arm as the trainer runs it, host launches
included; the median of `--reps` timed repetitions after two warm-ups, each synchronized):
- `adamw`: kernels/triton/adamw.adamw_step per tensor (what the no-hashing step runs);
- `hash`: kernels/triton/statehash.queue_digests over the params, grads, m and v (what the state hash runs);
- `adamw + hash`: the two, one after the other (the step's AdamW and its state hash before the fused kernel);
- `fused`: kernels/triton/adamw_digest.adamw_digests (AdamW that hashes the end state as it writes it).
Each arm's floor is printed beside it: AdamW's bytes at the measured copy bandwidth (4.3 TB/s), the hash's
bytes at the chunk pass's ALU rate measured on its own here. The bits are checked: the fused arm's parameters,
moments and digests equal the separate arms' on the same inputs.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.params import param_specs  # noqa: E402
from app.presets import OPEN_1B  # noqa: E402
from kernels.triton import adamw, adamw_digest, statehash  # noqa: E402

HBM = 4.3e12  # bytes/s, a device-to-device copy on the H200 (KINDS.md)
LR, STEP, WD = 3e-4, 7, 0.1


def state(layers: int, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """(param, grad, m, v, weight decay) per open-1b parameter, random values of the stored dtypes."""
    g = torch.Generator(device=device).manual_seed(0)
    out = []
    for s in param_specs(OPEN_1B.replace(**{"model.n_layers": layers}).model):
        def r(std):
            return torch.randn(s.shape, generator=g, device=device) * std
        out.append((r(0.02).to(s.dtype), r(1e-3), r(1e-4), r(1e-4).square(), WD if s.decayed else 0.0))
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


def clone(groups):
    return [tuple(t.clone() for t in grp[:4]) + (grp[4],) for grp in groups]


def timed(fn, groups, reps: int) -> float:
    """Median seconds of fn(groups) over reps, after two warm-ups; each on a fresh copy restored in place."""
    base = clone(groups)
    times = []
    for i in range(reps + 2):
        for grp, b in zip(groups, base):
            for t, x in zip(grp[:4], b[:4]):
                t.copy_(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(groups)
        torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_adamw(groups) -> None:
    for p, g, m, v, wd in groups:
        adamw.adamw_step(p, g, m, v, step=STEP, lr=LR, weight_decay=wd)


def run_hash(groups) -> torch.Tensor:
    return statehash.queue_digests([t for grp in groups for t in grp[:4]])


def run_both(groups) -> torch.Tensor:
    run_adamw(groups)
    return run_hash(groups)


def run_fused(groups) -> torch.Tensor:
    return adamw_digest.adamw_digests(groups, step=STEP, lr=LR)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "adamw_hash.json"))
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    groups = state(args.layers, dev)
    n = sum(grp[0].numel() for grp in groups)
    hashed = sum(t.numel() * t.element_size() for grp in groups for t in grp[:4])
    adam_bytes = sum(grp[0].numel() * (3 * grp[0].element_size() + 4 * 5) for grp in groups)  # p r/w, g, m and v r/w

    # bits: the fused kernel's end state and digests are the separate passes'
    a, b = clone(groups), clone(groups)
    want = run_both(a).cpu()
    got = run_fused(b).cpu()
    same = torch.equal(want, got) and all(torch.equal(bits(x), bits(y)) for ga, gb in zip(a, b)
                                          for x, y in zip(ga[:4], gb[:4]))
    del a, b

    arms = {"adamw": run_adamw, "hash": run_hash, "adamw + hash": run_both, "fused": run_fused}
    ms = {name: timed(fn, groups, args.reps) * 1e3 for name, fn in arms.items()}
    alu_ms_per_gib = ms["hash"] / (hashed / 2**30)
    floors = {"adamw": adam_bytes / HBM * 1e3, "hash": ms["hash"], "adamw + hash": adam_bytes / HBM * 1e3 + ms["hash"],
              "fused": max(adam_bytes / HBM * 1e3, ms["hash"])}
    print(f"\nopen-1b, {args.layers} layers: {len(groups)} tensors, {n / 1e9:.3f} G parameters, {hashed / 2**30:.2f} GiB "
          f"hashed, AdamW moves {adam_bytes / 1e9:.1f} GB; fused bits == separate: {same}")
    print("| arm | ms | vs adamw + hash | floor ms |")
    print("| --- | --- | --- | --- |")
    for name in arms:
        print(f"| {name} | {ms[name]:.2f} | {ms['adamw + hash'] / ms[name]:.2f}x | {floors[name]:.2f} |")
    print(f"\nthe hash alone: {alu_ms_per_gib:.3f} ms/GiB; what the fused kernel adds to AdamW: "
          f"{ms['fused'] - ms['adamw']:.2f} ms (separately: {ms['hash']:.2f} ms)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "layers": args.layers, "tensors": len(groups), "params": n,
                                         "hashed_bytes": hashed, "adamw_bytes": adam_bytes, "same_bits": same,
                                         "ms": ms, "floor_ms": floors, "hash_ms_per_gib": alu_ms_per_gib}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
