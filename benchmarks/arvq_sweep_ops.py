"""Kernels per group step of the ARVQ LDLQ sweep (quant/ldlq.py), counted on CPU: what bounds the sweep on a GPU.

    python3 benchmarks/arvq_sweep_ops.py [--ref REV] [--rows N] [--cols K] [--out benchmarks/results/arvq_sweep_ops.json]

A GPU sweep of w13 (K 6144) takes 768 group steps a pass, each a few small kernels on [N, 8] tensors, so its
time is launches, not arithmetic. This counts the top-level ATen ops that are not views (each one kernel
launch or more on a GPU) per group step with torch.profiler, for the working tree's sweep and, with --ref,
for quant/ldlq.py and quant/codebook.py as they were at git revision REV, on the same inputs, and checks that
both give the same codes. Needs only torch and git.
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quant import ldlq  # noqa: E402
from quant.format import GROUP  # noqa: E402
from quant.fp_formats import fp4_round  # noqa: E402

VIEWS = {"slice", "select", "unsqueeze", "numpy_T", "reshape", "view", "squeeze", "expand", "t", "transpose",
         "as_strided", "alias", "_unsafe_view", "expand_as", "lift_fresh", "detach", "empty", "empty_like",
         "unbind", "diagonal"}


def sweep_at(rev: str) -> types.ModuleType:
    """quant/ldlq.py at `rev`, importing quant/codebook.py at `rev` too."""
    cb = types.ModuleType(f"codebook_{rev}")
    src = subprocess.run(["git", "show", f"{rev}:quant/codebook.py"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    exec(compile(src, f"{rev}:quant/codebook.py", "exec"), cb.__dict__)
    mod = types.ModuleType(f"ldlq_{rev}")
    src = subprocess.run(["git", "show", f"{rev}:quant/ldlq.py"], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout
    sys.modules[cb.__name__] = cb
    exec(compile(src.replace("from quant.codebook import", f"from {cb.__name__} import"), f"{rev}:quant/ldlq.py",
                 "exec"), mod.__dict__)
    return mod


def problem(n: int, k: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(n, k, generator=g)
    x = torch.randn(4 * k, k, generator=g)
    h = x.T @ x / x.shape[0] + 0.01 * torch.eye(k)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    c0, c1 = fp4_round(torch.randn(256, 8, generator=g) * 3), fp4_round(torch.randn(256, 8, generator=g))
    return w, u, c0, c1, torch.full((n, k // 128), 1 / 3.0)


def count(mod: types.ModuleType, args: tuple, rounds: int) -> dict:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        codes = mod.sweep(*args, rounds=rounds)
    ops = [e.name[6:] for e in prof.events()
           if e.name.startswith("aten::") and e.cpu_parent is None and e.name[6:] not in VIEWS]
    groups = args[0].shape[1] // GROUP
    return {"ops_per_group": len(ops) / groups, "top": {k: v / groups for k, v in Counter(ops).most_common(12)}, "codes": codes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ref", default=None, help="git revision whose sweep is counted beside the working tree's")
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--out", default="benchmarks/results/arvq_sweep_ops.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    inputs = problem(args.rows, args.cols)
    runs = {"working tree": ldlq} | ({args.ref: sweep_at(args.ref)} if args.ref else {})
    result = {"command": "python3 " + " ".join(sys.argv), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "shape": [args.rows, args.cols], "beam": 8, "sweeps": {}}
    ref_codes = None
    for name, mod in runs.items():
        for rounds in (1, 0):
            r = count(mod, inputs, rounds)
            codes = r.pop("codes")
            if name == "working tree" and rounds == 1:
                ref_codes = codes
            elif rounds == 1:
                r["same_codes_as_working_tree"] = bool(torch.equal(codes, ref_codes))
            result["sweeps"][f"{name}, inner_refine {rounds}"] = r
            same = f"; same codes: {r['same_codes_as_working_tree']}" if "same_codes_as_working_tree" in r else ""
            print(f"{name}, inner_refine {rounds}: {r['ops_per_group']:.1f} kernels a group step{same}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
