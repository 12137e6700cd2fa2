"""Digests of every op case: `python -m kernels.golden [--device D] [--write FILE] [--check FILE]`.

The golden file (tests/kernels/golden.json) pins the numerics: any change of bits in any op, forward
or backward, at any shape shows up as a digest change and must be committed deliberately.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from kernels.cases import registry, run_case
from kernels.digest import tensor_digest

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "kernels", "golden.json")


def case_digests(device: str = "cpu", groups=None) -> dict[str, dict[str, str]]:
    """{case name: {output name: digest}} for every registered case, run on `device`."""
    cases = registry() if groups is None else registry(groups)
    out = {}
    for case in cases:
        outputs = run_case(case, device)
        out[case.name] = {k: tensor_digest(v) for k, v in sorted(outputs.items())}
    return out


def diff(expected: dict, actual: dict) -> list[str]:
    """Human-readable differences between two digest maps (missing, extra, changed outputs)."""
    lines = []
    for name in sorted(set(expected) | set(actual)):
        e, a = expected.get(name), actual.get(name)
        if e is None:
            lines.append(f"{name}: not in the golden file")
        elif a is None:
            lines.append(f"{name}: missing from this run")
        elif e != a:
            bad = sorted(k for k in set(e) | set(a) if e.get(k) != a.get(k))
            lines.append(f"{name}: outputs differ: {', '.join(bad)}")
    return lines


def load(path: str = GOLDEN) -> dict:
    with open(path) as f:
        return json.load(f)["cases"]


def write(digests: dict, path: str = GOLDEN) -> None:
    """Write the golden file atomically (temp file + rename)."""
    doc = {"torch": torch.__version__, "cases": digests}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.golden", description=__doc__)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads before running (0: leave)")
    p.add_argument("--write", metavar="FILE", help="write digests as the new golden file")
    p.add_argument("--check", metavar="FILE", nargs="?", const=GOLDEN, help="compare with a golden file")
    p.add_argument("--json", metavar="FILE", help="write this run's digests as JSON ('-' for stdout)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    digests = case_digests(args.device)
    if args.write:
        write(digests, args.write)
    if args.json:
        text = json.dumps(digests, sort_keys=True)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text)
    if args.check:
        problems = diff(load(args.check), digests)
        for line in problems:
            print(line)
        print(f"{len(digests) - len(problems)} cases match, {len(problems)} differ ({args.device})")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
