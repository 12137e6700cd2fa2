"""The op library's self-check: every case against the golden digests, every op's accuracy vs float64.

`python -m kernels.selfcheck [--device cpu|cuda]` (and `make demo` until training exists) prints one
table; exit status 1 if any digest differs or any accuracy bound is exceeded.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import torch
from rich.console import Console
from rich.table import Table

from kernels import golden
from kernels.accuracy import PROBES


def parity_rows(device: str) -> dict[str, tuple[list[str], int]]:
    """{op: (shape labels, number of cases whose digests differ from the golden file)}."""
    expected = golden.load()
    got = golden.case_digests(device)
    rows: dict[str, tuple[list[str], int]] = defaultdict(lambda: ([], 0))
    for name, outs in got.items():
        op, shape = name[:-1].split("[", 1)
        shapes, bad = rows[op]
        rows[op] = (shapes + [shape], bad + (expected.get(name) != outs))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernels.selfcheck", description=__doc__)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    console = Console(width=max(Console().width, 110))
    rows = parity_rows(args.device)
    table = Table(title=f"BR op library self-check on {args.device} (torch {torch.__version__})")
    for col in ("op", "cases", "golden digests", "accuracy vs float64", "bound"):
        table.add_column(col)
    failures = 0
    probes = defaultdict(list)
    for probe in PROBES:
        value = probe.measure()
        probes[probe.op].append((probe, value))
        failures += value > probe.bound
    for op in sorted(set(rows) | set(probes)):
        shapes, bad = rows.get(op, ([], 0))
        failures += bad
        verdict = ("[green]all match[/]" if not bad else f"[red]{bad} differ[/]") if shapes else "-"
        measured = probes.get(op) or [(None, None)]
        for i, (probe, value) in enumerate(measured):
            acc = bound = "-"
            if probe is not None:
                acc = f"{value:.3g} {probe.metric}"
                acc = acc if value <= probe.bound else f"[red]{acc}[/]"
                bound = f"{probe.bound:g}"
            table.add_row(op if i == 0 else "", str(len(shapes)) if i == 0 else "", verdict if i == 0 else "",
                          acc, bound)
    console.print(table)
    total = sum(len(s) for s, _ in rows.values())
    console.print(f"{total} cases over {len(rows)} ops, {len(PROBES)} accuracy probes: "
                  + ("[green]PASS[/]" if not failures else f"[red]FAIL ({failures})[/]"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
