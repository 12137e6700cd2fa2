"""Coverage of a run by audit certificates: per step and hardware kind, MATCH / MISMATCH / uncovered.

The run's verdict: FAILED at the first step any certificate found a mismatch; VERIFIED once every logged step
0..N-1 is certified MATCH (on at least one kind) and none mismatched; INCOMPLETE otherwise. A MISMATCH
certificate certifies its steps before the mismatch as MATCH (the replay compared them) and nothing after it.
A segment certified MATCH on two or more hardware kinds is cross-hardware.

The table's rows partition steps 0..N-1: a row starts wherever a certificate's segment (or a mismatch) starts or
ends, so jobs cut into different segments never give overlapping rows; uncovered steps are rows of their own, and
the map shows the same. A REFUSED certificate (the replay refused its input) certifies nothing: refusals are listed
apart, below the table, and are neither rows of it nor marks on the map.

A sampled job (replay/sampling.py) adds a statement of what its sample proves: the chance that it missed every
tampered segment, for 1 tampered segment and the fewest tampered segments it misses with under 5% and 1%.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from replay.certificates import RunLog, load_samples, load_valid
from replay.sampling import Sample, statement
from stream.fileio import atomic_path

UNCOVERED, MATCH, MISMATCH = 0, 1, 2
PNG = Path("audit") / "coverage.png"


@dataclass
class Coverage:
    log: RunLog
    certs: list[dict]
    warnings: list[str] = field(default_factory=list)
    samples: dict[str, Sample] = field(default_factory=dict)  # certificate file name -> the sample its job drew
    status: dict[str, np.ndarray] = field(default_factory=dict)  # kind -> per-step UNCOVERED/MATCH/MISMATCH

    def __post_init__(self) -> None:
        n = self.log.n_steps
        for c in self.certs:
            if c["verdict"] == "REFUSED":
                continue
            row = self.status.setdefault(c["kind"], np.zeros(n, dtype=np.int8))
            a, b = c["first_step"], c["end_step"]
            if c["verdict"] == "MATCH":
                row[a:b] = np.maximum(row[a:b], MATCH)  # a mismatch seen by another certificate stays
            elif c["verdict"] == "MISMATCH":
                k = c["mismatch_step"] if c["mismatch_step"] is not None else a
                row[a:k] = np.maximum(row[a:k], MATCH)
                row[k] = MISMATCH
        self.status = dict(sorted(self.status.items()))

    @property
    def n_steps(self) -> int:
        return self.log.n_steps

    def _any(self, value: int) -> np.ndarray:
        out = np.zeros(self.n_steps, dtype=bool)
        for row in self.status.values():
            out |= row == value
        return out

    @property
    def certified(self) -> int:
        """Steps certified MATCH on some kind and mismatched on none."""
        return int((self._any(MATCH) & ~self._any(MISMATCH)).sum())

    @property
    def cross_hardware_steps(self) -> int:
        kinds = sum((row == MATCH).astype(np.int32) for row in self.status.values()) if self.status else 0
        return int((np.asarray(kinds) >= 2).sum())

    @property
    def first_mismatch(self) -> int | None:
        bad = np.flatnonzero(self._any(MISMATCH))
        return int(bad[0]) if bad.size else None

    @property
    def verdict(self) -> str:
        k = self.first_mismatch
        if k is not None:
            return f"FAILED at step {k}"
        if self.n_steps and self.certified == self.n_steps:
            return f"VERIFIED: every step 0..{self.n_steps - 1} certified MATCH"
        return f"INCOMPLETE: {self.certified}/{self.n_steps} steps certified"

    def _spans(self) -> list[tuple[dict, int, int, int]]:
        """(certificate, first, end, mismatch step or -1) of every certificate that certifies something."""
        out = []
        for c in self.certs:
            if c["verdict"] == "MATCH":
                out.append((c, c["first_step"], c["end_step"], -1))
            elif c["verdict"] == "MISMATCH":
                k = c["mismatch_step"] if c["mismatch_step"] is not None else c["first_step"]
                out.append((c, c["first_step"], c["end_step"], k))
        return out

    def rows(self) -> list[dict]:
        """The table: rows [first, end) that partition steps 0..N-1, in order, as the map shows them.

        A row's MATCH kinds certified all its steps (a MISMATCH certificate does, before its divergence); its
        MISMATCH kinds diverged at its one step; a row without either is uncovered (adjacent ones joined)."""
        spans = self._spans()
        cuts = {0, self.n_steps}
        for _, a, b, k in spans:
            cuts |= {a, b} | ({k, k + 1} if k >= 0 else set())
        cuts = sorted(x for x in cuts if 0 <= x <= self.n_steps)
        out: list[dict] = []
        for a, b in zip(cuts, cuts[1:]):
            match = [c for c, x, y, k in spans if x <= a and b <= (y if k < 0 else min(y, k))]
            mism = [c for c, x, y, k in spans if k >= 0 and a <= k < b and x <= a and b <= y]
            if not match and not mism:
                if out and not out[-1]["covered"]:
                    out[-1]["end"] = b
                    continue
                out.append({"first": a, "end": b, "covered": False, "match": [], "mismatch": [], "jobs": 0,
                            "cross_hardware": False, "chain": None, "first_bad": None})
                continue
            out.append({"first": a, "end": b, "covered": True, "match": sorted({_label(c) for c in match}),
                        "mismatch": sorted({_label(c) for c in mism}),
                        "jobs": len({c["job_id"] for c in match + mism}),
                        "cross_hardware": len({c["kind"] for c in match}) >= 2,
                        "chain": self.log.chain(b - 1), "first_bad": mism[0] if mism else None})
        return out

    def kind_label(self, kind: str) -> str:
        """The kind as tables and the map name it: `*` marks a kind some job overrode (a simulated kind)."""
        return kind + ("*" if _overridden(self, kind) else "")

    def segments(self) -> list[dict]:
        """The table's covered rows (certified MATCH or MISMATCH on some kind)."""
        return [r for r in self.rows() if r["covered"]]

    def refused(self) -> list[dict]:
        """The REFUSED certificates, by segment: listed apart from the table (they certify nothing)."""
        return sorted((c for c in self.certs if c["verdict"] == "REFUSED"),
                      key=lambda c: (c["first_step"], c["end_step"], c["kind"], c["job_id"]))

    def sample_statements(self) -> list[str]:
        """What each sampled job proves, counting the drawn segments its own certificates certified."""
        out = []
        for name, sample in sorted(self.samples.items()):
            drawn = set(sample.drawn)
            certified = {(c["first_step"], c["end_step"]) for c in self.certs
                         if c["file"] == name and c["verdict"] != "REFUSED"} & drawn
            out.append(f"{statement(sample, len(certified))} (job {name.removesuffix('.parquet')})")
        return out

    def uncovered_ranges(self) -> list[tuple[int, int]]:
        """Maximal step ranges [a, b) that no kind certified (MATCH or MISMATCH)."""
        covered = self._any(MATCH) | self._any(MISMATCH)
        out, a = [], None
        for i, c in enumerate(covered.tolist() + [True]):
            if not c and a is None:
                a = i
            elif c and a is not None:
                out.append((a, i))
                a = None
        return out


def _label(c: dict) -> str:
    return c["kind"] + ("*" if c["kind_source"] != "detected" else "")


def coverage_of(run: str | Path | RunLog) -> Coverage:
    """Merge every audit job's certificates of `run` that vouch for its current log, with their jobs' samples."""
    log = run if isinstance(run, RunLog) else RunLog(run)
    certs, warnings = load_valid(log)
    samples, more = load_samples(log, certs)
    return Coverage(log, certs, warnings + more, samples)


def print_coverage(cov: Coverage, console=None) -> None:
    """The coverage table (rows partition the steps: segments as certified, uncovered ranges), the refused segments
    apart below it, then the verdict."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console(soft_wrap=True)
    for w in cov.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    t = Table(title=f"audit coverage of {cov.log.run} ({cov.n_steps} steps, run hash {cov.log.run_hash[:16]}...)")
    for col in ("steps", "MATCH on", "MISMATCH on", "jobs", "cross-hardware", "chain at end / first difference"):
        t.add_column(col)
    for s in cov.rows():
        steps = f"{s['first']}..{s['end'] - 1}"
        if not s["covered"]:
            t.add_row(steps, "", "", "0", "", "[dim]uncovered[/]", style="dim")
            continue
        bad = s["first_bad"]
        note = (f"[red]step {bad['mismatch_step']} {bad['mismatch_stage']}: {bad['mismatch_detail']}[/]" if bad
                else f"{s['chain'][:16]}...")
        t.add_row(steps, f"[green]{', '.join(s['match'])}[/]", f"[red]{', '.join(s['mismatch'])}[/]", str(s["jobs"]),
                  "[bold green]yes[/]" if s["cross_hardware"] else "", note)
    console.print(t)
    refused = cov.refused()
    if refused:
        r = Table(title=f"refused: {len(refused)} segment(s), nothing certified (fix the input, audit them again)")
        for col in ("steps", "kind", "job", "reason"):
            r.add_column(col)
        for c in refused:
            r.add_row(f"{c['first_step']}..{c['end_step'] - 1}", _label(c), c["job_id"], c["mismatch_detail"] or "",
                      style="yellow")
        console.print(r)
    for line in cov.sample_statements():
        console.print(line, highlight=False)
    if any(c["kind_source"] != "detected" for c in cov.certs):
        console.print("[dim]* kind overridden by the audit job (a simulated hardware kind, for tests)[/]")
    style = "red" if cov.verdict.startswith("FAILED") else "green" if cov.verdict.startswith("VERIFIED") else "yellow"
    console.print(f"[bold {style}]{cov.verdict}[/]; cross-hardware: {cov.cross_hardware_steps}/{cov.n_steps} steps; "
                  f"run hash {cov.log.run_hash}")


def draw_coverage(cov: Coverage, path: str | Path | None = None) -> Path:
    """The coverage map PNG: steps on x, hardware kinds on y; MATCH green, MISMATCH red, uncovered grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path) if path is not None else cov.log.run / PNG
    path.parent.mkdir(parents=True, exist_ok=True)
    kinds = list(cov.status) or ["(no certificates)"]
    colors = {UNCOVERED: "#bbbbbb", MATCH: "#2ca02c", MISMATCH: "#d62728"}
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(kinds)))
    for y, kind in enumerate(kinds):
        row = cov.status.get(kind, np.zeros(cov.n_steps, dtype=np.int8))
        for a, b, v in sorted(_runs(row), key=lambda r: r[2] == MISMATCH):  # mismatches last, on top
            # a mismatch is one step: drawn at least 1/400 of the axis wide, so it shows on a run of any length
            width = max(b - a, cov.n_steps / 400) if v == MISMATCH else b - a
            ax.broken_barh([(a, width)], (y - 0.4, 0.8), color=colors[v])
        starts = sorted({c["first_step"] for c in cov.certs if c["kind"] == kind and c["verdict"] != "REFUSED"} - {0})
        gaps = np.diff([0, *starts])
        if len(starts) <= 200 and (not starts or gaps.min() >= cov.n_steps / 200):  # boundaries, while readable
            ax.vlines(starts, y - 0.4, y + 0.4, color="white", linewidth=0.8)
    ax.set_yticks(range(len(kinds)), [cov.kind_label(k) for k in kinds])
    ax.set_xlim(0, max(cov.n_steps, 1))
    ax.set_xlabel("step")
    n_refused = len(cov.refused())
    ax.set_title(cov.verdict + (f" ({n_refused} refused segment(s): not shown, see the table)" if n_refused else ""),
                 fontsize=10)
    ax.legend(handles=[Patch(color=colors[MATCH], label="MATCH"), Patch(color=colors[MISMATCH], label="MISMATCH"),
                       Patch(color=colors[UNCOVERED], label="uncovered")], loc="upper left",
              bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
    return path


def _overridden(cov: Coverage, kind: str) -> bool:
    return any(c["kind"] == kind and c["kind_source"] != "detected" for c in cov.certs)


def _runs(row: np.ndarray) -> list[tuple[int, int, int]]:
    """Maximal runs [a, b) of equal values, with the value."""
    out, a = [], 0
    for i in range(1, len(row) + 1):
        if i == len(row) or row[i] != row[a]:
            out.append((a, i, int(row[a])))
            a = i
    return out


def coverage_main(run: str) -> int:
    """`python -m app audit coverage`: 0 VERIFIED, 1 FAILED, 3 INCOMPLETE."""
    cov = coverage_of(run)
    print_coverage(cov)
    png = draw_coverage(cov)
    print(f"coverage map: {png}")
    return exit_code(cov.verdict)


def exit_code(verdict: str) -> int:
    return 0 if verdict.startswith("VERIFIED") else 1 if verdict.startswith("FAILED") else 3
