"""SASS instruction counts of the state hash's chunk kernel, a 64-byte block of a whole program, for both loads.

    python benchmarks/sass_blake3.py [--out benchmarks/results/sass_blake3.json]

No GPU: the kernel is compiled for sm_90 here (kernels/triton/offline.compile_sm90) and disassembled with the
nvdisasm that Triton's package carries. The chunk loop is a diamond: a head, then either the whole-program
load (no bounds) or the masked one, then the compression; the table counts the head, the whole-program arm and
the compression, by the pipe the instructions issue to on sm_90 (integer ALU: logic, shifts, 3-input adds,
compares, selects; IMAD: the multiply-adds ptxas moves adds to). Registers from ptxas. The pass is bound by
the integer ALU (docs/perf.md), so those counts are what a change to the loads is judged by before timing.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import triton  # noqa: E402

from kernels.triton import statehash  # noqa: E402
from kernels.triton.offline import compile_sm90, ptxas_usage  # noqa: E402

SIG = {"table": "*i64", "starts": "*i64", "ws": "*i32", "T": "i32", "one": "i32"}
ALU = ("LOP3", "SHF", "IADD3", "ISETP", "SEL", "PRMT", "LEA", "VIADD", "PLOP3", "CS2R", "MOV")
INSN = re.compile(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)")
LABEL = re.compile(r"\.L_x_(\d+):")
BRANCH = re.compile(r"(@!?P\d+\s+)?BRA `\(\.L_x_(\d+)\)")


def sass(v4: bool, prefetch: bool) -> tuple[list[str], dict]:
    kernel = compile_sm90(statehash._chunk_kernel, SIG, dict(num_warps=4), TPAD=64, LANES=128, V4=v4,
                          PREFETCH=prefetch)
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "chunk.cubin")
        Path(path).write_bytes(kernel.asm["cubin"])
        text = subprocess.run([nvdisasm, "-c", path], capture_output=True, text=True, check=True).stdout
    return text.splitlines(), ptxas_usage(kernel)


def whole_program_path(lines: list[str]) -> list[str]:
    """The loop's instructions on the whole-program arm: head, the arm whose loads carry no bounds, compression."""
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    back = max((i for i, line in enumerate(lines) if (m := BRANCH.search(line)) and m.group(1)
                and labels.get(m.group(2), len(lines)) < i), key=lambda i: i - labels[BRANCH.search(lines[i]).group(2)])
    top = labels[BRANCH.search(lines[back]).group(2)]
    fork = next(i for i in range(top, back) if (m := BRANCH.search(lines[i])) and m.group(1))
    taken = labels[BRANCH.search(lines[fork]).group(2)]
    jump = next((i for i in range(fork + 1, taken) if BRANCH.search(lines[i])), None)  # the fall-through's end
    if jump is None:  # a triangle: the branch skips the fall-through arm straight to the compression
        arms, join = {"fall": lines[fork + 1:taken], "taken": []}, taken
    else:
        join = labels[BRANCH.search(lines[jump]).group(2)]
        arms = {"fall": lines[fork + 1:jump + 1], "taken": lines[taken:join]}

    def bounded(arm):  # the masked arm's loads are predicated on their bounds
        return sum(1 for x in arm if re.search(r"@!?P\d+\s+LDG", x))
    arm = min(arms.values(), key=bounded)
    return lines[top:fork + 1] + arm + lines[join:back + 1]


def count(path: list[str]) -> dict:
    ops = collections.Counter(m.group(2) for x in path if (m := INSN.match(x)))
    return {"instructions": sum(ops.values()),
            "integer_alu": sum(v for k, v in ops.items() if k.split(".")[0] in ALU),
            "imad": sum(v for k, v in ops.items() if k.startswith("IMAD")),
            "loads": {k: v for k, v in ops.items() if k.startswith("LDG")},
            "shared_and_barriers": sum(v for k, v in ops.items() if k.split(".")[0] in ("STSM", "STS", "LDS", "BAR"))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "sass_blake3.json"))
    args = ap.parse_args(argv)
    rows = {}
    for name, v4, prefetch in (("tile loads (VECTOR_LOADS off)", False, False), ("16-byte loads", True, False),
                               ("16-byte loads a block ahead (production)", True, True)):
        lines, use = sass(v4, prefetch)
        rows[name] = {**count(whole_program_path(lines)), "registers": use["registers"]}
    print("| whole-program path, a block | instructions | integer-ALU pipe | IMAD pipe | loads | shared/barriers "
          "| registers |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(f"| {name} | {r['instructions']} | {r['integer_alu']} | {r['imad']} | {r['loads']} | "
              f"{r['shared_and_barriers']} | {r['registers']} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"triton": triton.__version__, "target": "sm_90", "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
