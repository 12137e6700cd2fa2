"""`python -m app audit site --run RUN --out DIR`: the audit site of one run (replay/site/__init__.py).

Reads the run directory and its certificates and never writes there: DIR may not be the run or lie inside it.
The site is built in a temporary sibling of DIR and renamed into place whole (stream/fileio.py); a DIR that
holds an earlier site (its site.json says so) is replaced, anything else is refused.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from replay.coverage import draw_coverage
from replay.site import commands, data, pages, plots
from replay.site.documents import DEFAULT_STEPS, parse_step_range, step_documents
from replay.site.status import MISMATCHED, step_status
from replay.site.view import RunView, read_run
from stream.fileio import atomic_directory, atomic_write_json
from training.errors import ConfigError

MARKER = "site.json"
FORMAT = "audit-site/1"


@dataclass(frozen=True)
class SiteOptions:
    documents_steps: str = DEFAULT_STEPS  # A:B: list the documents of steps A..B-1 (and every MISMATCH step)
    corpus: str | None = None  # read the documents from this copy of the corpus (default: the run's)


@dataclass
class SiteSummary:
    out: Path
    steps: int
    verdict: str
    documents: int  # steps whose documents the site lists
    note: str  # why it lists none, where it lists none it was asked for
    seconds: float


def check_out(run: Path, out: Path) -> None:
    """Refuse an output that would touch the run, or replace something that is not an earlier site."""
    r, o = run.resolve(), out.resolve()
    if o == r or r in o.parents:
        raise ConfigError(f"--out {out}: inside the run directory {run}; the site never writes there, choose a "
                          f"directory outside it")
    if o in r.parents:
        raise ConfigError(f"--out {out}: contains the run directory {run}; choose a directory beside it")
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).is_file())):
        raise ConfigError(f"--out {out}: exists and is not an audit site (no {MARKER}); choose a new directory or "
                          f"remove it")


@contextmanager
def publishing(out: Path) -> Iterator[Path]:
    """A directory to fill that becomes `out` whole on success (an earlier site at `out` is replaced)."""
    if not out.exists():
        with atomic_directory(out) as tmp:
            yield tmp
        return
    tag = uuid.uuid4().hex[:8]
    new, old = out.parent / f".{out.name}.new-{tag}", out.parent / f".{out.name}.old-{tag}"
    with atomic_directory(new) as tmp:
        yield tmp
    os.rename(out, old)
    os.rename(new, out)
    shutil.rmtree(old)


def documents_steps(view: RunView, text: str, codes) -> tuple[tuple[int, int], list[int]]:
    """The range asked for and the steps whose documents are listed: the range plus every MISMATCH step."""
    a, b = parse_step_range(text, view.coverage.n_steps)
    return (a, b), sorted(set(range(a, b)) | {int(s) for s in (codes == MISMATCHED).nonzero()[0]})


def write_plots(root: Path, view: RunView) -> list[tuple[str, str]]:
    """plots/*.png; (file, caption) of each one written."""
    root.mkdir()
    recs, evals, t = view.records, view.evals, view.cfg.train
    made = [("loss.png", plots.plot_loss(recs, evals, root / "loss.png"), "loss and training CE per step, held-out CE"),
            ("grad_norm.png", plots.plot_grad_norm(recs, t.clip_norm, t.spike_threshold, root / "grad_norm.png"),
             "pre-clip gradient norm with the clip and spike thresholds"),
            ("lr.png", plots.plot_lr(recs, root / "lr.png"), "learning rate"),
            ("weight_norms.png", plots.plot_weight_norms(recs, evals, root / "weight_norms.png"),
             "weight norms per layer, at each evaluation"),
            ("heldout.png", plots.plot_heldout(recs, evals, root / "heldout.png"), "held-out cross-entropy")]
    return [(name, caption) for name, path, caption in made if path is not None]


def build_site(run: str | Path, out: str | Path, opts: SiteOptions = SiteOptions()) -> SiteSummary:
    """Write the audit site of `run` into `out` (module doc)."""
    t0 = time.perf_counter()
    run, out = Path(run), Path(out)
    view = read_run(run)
    check_out(run, out)
    codes, label, labels = step_status(view.coverage)
    asked, chosen = documents_steps(view, opts.documents_steps, codes)
    docs, note = step_documents(run, view.cfg, view.desc, chosen, opts.corpus)
    with publishing(out) as tmp:
        for name in pages.STATIC:
            (tmp / name).write_text(pages.asset(name), encoding="utf-8")
        data.write_data(tmp / "data" / "run.js", "run", data.run_data(view, str(run), asked, note))
        data.write_data(tmp / "data" / "steps.js", "steps", data.steps_table(view, codes, label, labels))
        data.write_data(tmp / "data" / "certificates.js", "certificates", data.certificates(view, str(run)))
        data.write_chunks(tmp / "data", view, codes, label, labels, docs)
        draw_coverage(view.coverage, tmp / "coverage.png")
        figures = write_plots(tmp / "plots", view)
        train = commands.train_command(view.cfg, view.records, view.checkpoints, [e["step"] for e in view.evals],
                                       str(run))
        jobs = commands.job_commands(view.coverage.certs, str(run), view.coverage.samples)
        whole = commands.whole_run_commands(str(run), view.coverage.n_steps)
        (tmp / "index.html").write_text(pages.overview(view, codes, train, jobs, whole), encoding="utf-8")
        (tmp / "plots.html").write_text(pages.plots(view, figures), encoding="utf-8")
        (tmp / "steps.html").write_text(pages.steps(view), encoding="utf-8")
        (tmp / "step.html").write_text(pages.step(view), encoding="utf-8")
        atomic_write_json(tmp / MARKER, {"format": FORMAT, "run": str(run.resolve()), "run_hash": view.log.run_hash,
                                         "steps": view.coverage.n_steps, "verdict": view.coverage.verdict,
                                         "documents_steps": sorted(docs), "documents_note": note,
                                         "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                          durable=False)
    return SiteSummary(out, view.coverage.n_steps, view.coverage.verdict, len(docs), note, time.perf_counter() - t0)


def site_main(run: str, out: str, opts: SiteOptions) -> int:
    """`python -m app audit site`: build the site, print where it is."""
    s = build_site(run, out, opts)
    print(f"audit site of {run}: {s.steps} steps, {s.verdict}; documents listed for {s.documents} step(s)"
          + (f" ({s.note})" if s.note else "") + f"; {s.seconds:.1f} s")
    print(f"open {s.out / 'index.html'} (or serve it: python -m http.server -d {s.out})")
    return 0
