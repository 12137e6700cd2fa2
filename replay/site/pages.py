"""The site's HTML: every page is assets/page.html around a body. The overview and the plots page are written
here, every value through html.escape; the steps table and the step view are static bodies that site.js fills
from the data files (with textContent)."""
from __future__ import annotations

import html
from importlib import resources
from string import Template

import numpy as np

from replay.coverage import MATCH, MISMATCH
from replay.site.status import STATUS_NAMES
from replay.site.view import RunView

ASSETS = resources.files("replay.site") / "assets"
STATIC = ("site.css", "site.js")  # copied into the site as they are


def asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def e(value: object) -> str:
    """Text from the run, its corpus or a certificate, as HTML text (never markup)."""
    return html.escape(str(value), quote=True)


def page(title: str, name: str, run_name: str, body: str, data: tuple[str, ...] = ()) -> str:
    """A whole page: `body` is HTML built here (its values escaped); `data` the data scripts it loads."""
    scripts = "\n".join(f'<script src="{e(src)}"></script>' for src in data)
    return Template(asset("page.html")).substitute(title=e(title), page=e(name), run=e(run_name), data=scripts,
                                                   body=body)


def table(head: list[str], rows: list[list[str]], cls: str = "grid") -> str:
    """Cells are HTML already (escape values with `e` when building them)."""
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{th}</tr>{body}</table>'


def kv(rows: list[tuple[str, str]]) -> str:
    return '<table class="kv">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _step_link(step: int) -> str:
    return f'<a href="step.html?step={int(step)}">{int(step)}</a>'


def _verdict_class(verdict: str) -> str:
    return "bad" if verdict.startswith("FAILED") else "ok" if verdict.startswith("VERIFIED") else "partial"


def verdict_section(view: RunView, codes: np.ndarray) -> str:
    cov = view.coverage
    counts = np.bincount(codes.astype(np.int64), minlength=len(STATUS_NAMES)) if codes.size else np.zeros(4, int)
    by_status = ", ".join(f'<a href="steps.html?status={e(name)}">{int(n)} {e(name)}</a>'
                          for name, n in zip(STATUS_NAMES, counts) if n)
    tokens = view.records[-1]["tokens"] if view.records else 0
    return (f'<section class="verdict {_verdict_class(cov.verdict)}"><p class="verdict-text" id="verdict">'
            f'{e(cov.verdict)}</p><p id="step-count">{cov.n_steps} steps, {tokens} tokens; cross-hardware: '
            f'{cov.cross_hardware_steps}/{cov.n_steps} steps</p><p>steps by audit status: {by_status}</p></section>')


def identity_section(view: RunView) -> str:
    desc = view.desc or {}
    corpus = desc.get("corpus") or {}
    none = '<span class="note">not recorded (no run.json)</span>' if view.desc is None else "?"

    def hashed(value: object) -> str:
        return f'<span class="hash">{e(value)}</span>' if value else none

    rows = [("run directory", e(view.path)),
            ("run hash (the last chain hash)", hashed(view.log.run_hash)),
            ("code version", hashed(view.init.get("code_version"))),
            ("corpus manifest digest", hashed(corpus.get("manifest_blake3"))),
            ("corpus recorded at", e(corpus["path"]) if corpus.get("path") else none),
            ("tokenizer digest", hashed(corpus.get("tokenizer_blake3"))),
            ("config digest", hashed(desc.get("config_blake3"))),
            ("collectives", e(desc["collectives"]) if desc.get("collectives") else none),
            ("initial state hash", hashed(view.init.get("state_hash"))),
            ("checkpoints", e(", ".join(map(str, view.checkpoints)) or "none"))]
    return "<h2>Identity</h2>" + kv(rows)


def coverage_section(view: RunView) -> str:
    cov = view.coverage
    n = cov.n_steps
    kinds = [[e(cov.kind_label(k)), str(int((row == MATCH).sum())), str(int((row == MISMATCH).sum())),
              str(int(n - (row == MATCH).sum() - (row == MISMATCH).sum())),
              str(sum(1 for c in cov.refused() if c["kind"] == k))] for k, row in cov.status.items()]
    out = ["<h2>Coverage by device kind</h2>"]
    out += [f'<p class="note">warning: {e(w)}</p>' for w in cov.warnings]
    out += [f'<p class="sample">{e(line)}</p>' for line in cov.sample_statements()]  # as `audit coverage` says it
    out.append(table(["kind", "steps MATCH", "steps MISMATCH", "steps not covered", "refused segments"], kinds)
               if kinds else '<p class="note">no certificate covers any step yet: audit the run with '
                             '<code>python -m app audit batch</code></p>')
    out.append('<figure><img src="coverage.png" alt="coverage map: steps on x, hardware kinds on y"><figcaption>'
               'steps on x, hardware kinds on y: MATCH green, MISMATCH red, uncovered grey (replay/coverage.py); '
               '* marks a simulated kind</figcaption></figure>')
    rows = []
    for r in cov.rows():
        steps = f'{_step_link(r["first"])}..{_step_link(r["end"] - 1)}'
        if not r["covered"]:
            rows.append([steps, "", "", "0", "", '<span class="status-0">uncovered</span>'])
            continue
        bad = r["first_bad"]
        note = (f'<span class="status-2">step {_step_link(bad["mismatch_step"])} {e(bad["mismatch_stage"])}: '
                f'{e(bad["mismatch_detail"])}</span>' if bad else f'<span class="hash">{e(r["chain"])}</span>')
        rows.append([steps, f'<span class="status-1">{e(", ".join(r["match"]))}</span>',
                     f'<span class="status-2">{e(", ".join(r["mismatch"]))}</span>', str(r["jobs"]),
                     "yes" if r["cross_hardware"] else "", note])
    out.append("<h3>Coverage table</h3>" + table(["steps", "MATCH on", "MISMATCH on", "jobs", "cross-hardware",
                                                   "chain at end / first difference"], rows))
    refused = cov.refused()
    if refused:
        out.append(f"<h3>Refused: {len(refused)} segment(s), nothing certified</h3>" + table(
            ["steps", "kind", "job", "reason"],
            [[f'{_step_link(c["first_step"])}..{_step_link(c["end_step"] - 1)}', e(cov.kind_label(c["kind"])),
              e(c["job_id"]), e(c["mismatch_detail"] or "")] for c in refused]))
    return "\n".join(out)


def commands_section(train: tuple[str | None, str], jobs: list[dict], whole: list[str]) -> str:
    cmd, note = train
    out = ["<h2>Reproduce</h2>", "<h3>The run</h3>"]
    out.append(f"<pre>{e(cmd)}</pre>" if cmd else "")
    out.append(f'<p class="note">{e(note)}</p>' if note else "")
    out.append('<p class="note">The same command writes the same hashlog.jsonl, byte for byte, on any machine.</p>'
               if cmd else "")
    out.append("<h3>Its audits</h3>")
    if jobs:
        out.append(table(["job", "segments", "kinds", "verdicts", "command"],
                         [[e(j["job"]), str(j["segments"]), e(", ".join(j["kinds"])),
                           e(", ".join(f"{n} {v}" for v, n in j["verdicts"].items())),
                           f'<code>{e(j["command"])}</code>'] for j in jobs]))
    out.append("<p>Merge every job's certificates, or replay every step on one machine:</p>")
    out.append("<pre>" + "\n".join(e(c) for c in whole) + "</pre>")
    out.append('<p class="note">Each certificate\'s own <code>audit replay</code> line is in the step view.</p>')
    return "\n".join(out)


def config_section(view: RunView) -> str:
    d = view.cfg.to_dict()
    model = [(e(k), e(v)) for k, v in d["model"].items()]
    train = [(e(k), e(v)) for k, v in d["train"].items()]
    return (f"<h2>Config: {e(d['name'])}</h2><h3>Model</h3>{kv(model)}<h3>Recipe</h3>{kv(train)}")


def overview(view: RunView, codes: np.ndarray, train: tuple[str | None, str], jobs: list[dict],
             whole: list[str]) -> str:
    name = view.path.resolve().name
    body = "\n".join([f"<h1>Audit of {e(name)}</h1>", verdict_section(view, codes), identity_section(view),
                      coverage_section(view), commands_section(train, jobs, whole), config_section(view)])
    return page(f"{name}: audit overview", "overview", name, body)


def plots(view: RunView, figures: list[tuple[str, str]]) -> str:
    """`figures`: (file under plots/, caption)."""
    name = view.path.resolve().name
    body = ["<h1>Plots</h1>", '<p class="note">Over steps; red lines mark skipped (spike) steps, dashed black lines '
                              'topology changes (resizes).</p>']
    body += [f'<figure><img src="plots/{e(f)}" alt="{e(c)}"><figcaption>{e(c)}</figcaption></figure>'
             for f, c in figures]
    return page(f"{name}: plots", "plots", name, "\n".join(body))


def steps(view: RunView) -> str:
    name = view.path.resolve().name
    return page(f"{name}: steps", "steps", name, asset("steps.body.html"), ("data/run.js", "data/steps.js"))


def step(view: RunView) -> str:
    name = view.path.resolve().name
    return page(f"{name}: step", "step", name, asset("step.body.html"), ("data/run.js", "data/certificates.js"))
