"""The audit site (`audit site`): built from a 6-step tiny run and certificates made in this process (no Ray), then
read in a real browser, headless Chromium: what a person sees is the verdict, the steps, a step's documents, the
MISMATCH of an edited log at its step, and a document holding markup as text. The browser tests skip only where no
Chromium binary is found."""
from __future__ import annotations

import html
import importlib.util
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from replay.batch import certificate_row, detect_kind, machine_facts, plan_segments
from replay.certificates import RunLog, write_certificates
from replay import documents as run_documents
from replay.site.build import SiteOptions, build_site
from replay.site.status import mismatch_parts
from stream import open_stream
from stream.readers import read_documents
from training.rundir import list_checkpoints
from training.step import schedules
from training.train import TrainOptions, train

STEPS = 6
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _certify(run: Path, job: str = "20261207T000000Z-test") -> list[dict]:
    """Certificates of every 2-step segment, replayed here as an auditor would, filed as a job."""
    log = RunLog(run)
    rows = [certificate_row(run, a, b, job, log, "cpu", detect_kind("cpu"), "detected", machine_facts("cpu"))
            for a, b in plan_segments(0, log.n_steps, 2, list_checkpoints(run))]
    write_certificates(run, job, rows)
    return rows


@pytest.fixture(scope="module")
def run(tiny, one_thread, tmp_path_factory) -> Path:
    """tiny, 6 steps, checkpoints and held-out evaluations every 2, every step certified MATCH."""
    out = tmp_path_factory.mktemp("site-runs") / "tiny6"
    train(tiny, out, TrainOptions(steps=STEPS, checkpoint_every=2, eval_every=2, progress=False))
    assert [r["verdict"] for r in _certify(out)] == ["MATCH"] * 3
    return out


@pytest.fixture(scope="module")
def edited(run, tmp_path_factory) -> Path:
    """A copy whose log has another state hash at step 3, audited again: its certificate says MISMATCH there."""
    out = tmp_path_factory.mktemp("site-edited") / "tiny6-edited"
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("audit"))
    lines = (out / "hashlog.jsonl").read_text().splitlines()
    rec = json.loads(lines[3 + 1])
    rec["state_hash"] = "ab" * 32
    lines[3 + 1] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    (out / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    rows = _certify(out)
    assert [(r["verdict"], r["mismatch_step"]) for r in rows][1] == ("MISMATCH", 3)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _data(site: Path, rel: str) -> dict:
    """A data file's value: `SITE.receive(name, <json>);`."""
    text = (site / rel).read_text()
    return json.loads(text[text.index(",") + 1:text.rindex(")")])


@pytest.fixture(scope="module")
def site(run, tmp_path_factory) -> Path:
    before = _files(run)
    out = tmp_path_factory.mktemp("sites") / "tiny6"
    s = build_site(run, out)
    assert (s.steps, s.verdict, s.documents, s.note) == (STEPS, f"VERIFIED: every step 0..{STEPS - 1} certified "
                                                                 f"MATCH", STEPS, "")
    assert _files(run) == before, "the run directory and its certificates are read, never written"
    return out


def test_site_files_and_the_documents_of_a_step(site, run, tiny):
    assert {"index.html", "plots.html", "steps.html", "step.html", "site.css", "site.js", "site.json",
            "coverage.png", "data/run.js", "data/steps.js", "data/certificates.js", "data/steps/000000.js",
            "plots/loss.png", "plots/grad_norm.png", "plots/lr.png", "plots/weight_norms.png",
            "plots/heldout.png"} <= set(_files(site))
    assert not re.search(r"https?://", (site / "index.html").read_text() + (site / "site.js").read_text()), \
        "nothing is loaded from elsewhere"
    table = _data(site, "data/steps.js")
    assert table["n"] == STEPS and table["status"] == [1] * STEPS
    chunk = _data(site, "data/steps/000000.js")
    step1 = chunk["steps"][1]
    assert step1["record"] == RunLog(run).records[2] and step1["prev_chain"] == RunLog(run).records[1]["chain_hash"]
    # the step view's documents are stream/provenance.py's rows of the run's own stream, with their text
    s = open_stream(tiny.train.corpus, seq_len=tiny.model.seq_len, seed=tiny.train.seed)
    from stream.provenance import step_provenance
    rows = step_provenance(s, schedules(tiny)[0], 1)
    pieces = step1["documents"]["pieces"]
    assert [(p["window"], p["shard"], p["document"], p["tokens"]) for p in pieces] == [
        (r["window"], r["shard"], r["document"], r["tokens"]) for r in rows]
    m = s.manifest
    for p in pieces:
        src = next(x for x in m.sources if x.name == p["source"])
        doc = read_documents(m.root / p["shard"], src.text_column).texts[p["document"]]
        assert p["text"].strip()[:200] in doc, "a piece's text is a span of its document"


def _chromium() -> str:
    for name in BROWSERS:
        if (path := shutil.which(name)):
            return path
    pytest.skip(f"no Chromium binary on PATH (looked for {', '.join(BROWSERS)}; `apt-get install -y chromium`)")


def _dom(page: Path, query: str = "", profile: Path | None = None) -> str:
    """The DOM after the page's scripts ran, as headless Chromium serializes it (opened from file://)."""
    url = page.resolve().as_uri() + query
    profile = profile or page.parent.parent / f".chromium-{page.parent.name}"
    out = subprocess.run([_chromium(), "--headless=new", "--disable-gpu", "--no-sandbox", f"--user-data-dir={profile}",
                          "--virtual-time-budget=5000", "--dump-dom", url], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "<html" in out.stdout, out.stderr[-2000:]
    return out.stdout


class _Elements(HTMLParser):
    """Every element's tag, attributes and text, as the serialized DOM holds them."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.found: list[list] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.found.append([tag, dict(attrs), ""])

    def handle_data(self, data):
        if self.found:
            self.found[-1][2] += data


def _rows(dom: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr class="row-\d" data-step="(\d+)"', dom)]


def test_browser_shows_the_verdict_the_steps_and_a_steps_documents(site):
    index = _dom(site / "index.html")
    assert f"VERIFIED: every step 0..{STEPS - 1} certified MATCH" in index
    assert f"{STEPS} steps" in index and "python -m app train --config tiny" in index
    steps = _dom(site / "steps.html")
    assert _rows(steps) == list(range(STEPS)) and f"{STEPS} of {STEPS} steps" in steps
    assert steps.count("MATCH on cpu_x86") == STEPS
    assert _rows(_dom(site / "steps.html", "?from=2&to=3")) == [2, 3]
    view = _dom(site / "step.html", "?step=1")
    assert "Step 1" in view and "window 2" in view and "window 3" in view
    piece = _data(site, "data/steps/000000.js")["steps"][1]["documents"]["pieces"][0]
    words = " ".join(piece["text"].split()[:6])
    assert html.escape(words, quote=False) in " ".join(view.split()), "the excerpt of the step's first document"
    assert piece["shard"] in view


def test_browser_shows_the_mismatch_at_its_step(edited, tmp_path):
    build_site(edited, tmp_path / "site")
    index = _dom(tmp_path / "site" / "index.html")
    assert "FAILED at step 3" in index
    mism = _dom(tmp_path / "site" / "steps.html", "?status=MISMATCH")
    assert _rows(mism) == [3] and f"1 of {STEPS} steps" in mism
    view = _dom(tmp_path / "site" / "step.html", "?step=3")
    assert "MISMATCH on cpu_x86 at stage state" in view and "state hash: logged " + "ab" * 32 in view
    assert "audit status: MISMATCH on cpu_x86" in view
    assert "audit status: MATCH on cpu_x86" in _dom(tmp_path / "site" / "step.html", "?step=2")


def test_markup_in_a_document_or_a_certificate_is_shown_as_text(run, tmp_path, monkeypatch):
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    monkeypatch.setattr(run_documents, "piece_text", lambda stream, tok, row, limit=600: (evil, False))
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    rows = [{**c, "job_id": "<b>job</b><script>alert(3)</script>"} for c in _first_certificate(copy)]
    write_certificates(copy, "evil", rows)
    build_site(copy, tmp_path / "site", SiteOptions(documents_steps="0:1"))
    for page, query in (("step.html", "?step=0"), ("index.html", "")):
        dom = _dom(tmp_path / "site" / page, query)
        elements = _Elements(dom).found
        assert not [e for e in elements if e[0] == "b" or (e[0] == "img" and "onerror" in e[1])], \
            f"{page}: markup from the data became elements"
        assert not [e for e in elements if e[0] == "script" and "alert" in (e[2] + json.dumps(e[1]))], page
        assert "&lt;script&gt;alert(3)&lt;/script&gt;" in dom, page
    step = _dom(tmp_path / "site" / "step.html", "?step=0")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in step


def _first_certificate(run: Path) -> list[dict]:
    """The run's certificate of steps [0, 2), as its auditor filled it."""
    from replay.certificates import certificate_files, read_certificates
    return [r for r in read_certificates(certificate_files(run)[0]) if r["first_step"] == 0]


def test_refused_input_is_one_line_and_a_site_is_replaced(run, site, tmp_path, capsys):
    from app.cli import main

    cases = [(["--run", str(tmp_path / "missing"), "--out", str(tmp_path / "s1")], "not a run directory"),
             (["--run", str(run), "--out", str(run / "site")], "inside the run directory"),
             (["--run", str(run), "--out", str(run.parent)], "contains the run directory"),
             (["--run", str(run), "--out", str(run / "checkpoints")], "inside the run directory"),
             (["--run", str(run), "--out", str(tmp_path / "s2"), "--documents-steps", "5"], "--documents-steps")]
    (tmp_path / "x").write_text("not a site")
    cases.append((["--run", str(run), "--out", str(tmp_path)], "not an audit site"))
    lacking = Path(shutil.copytree(run, tmp_path / "lacking", ignore=shutil.ignore_patterns("audit", "checkpoints")))
    lines = (lacking / "hashlog.jsonl").read_text().splitlines()
    rec = json.loads(lines[3])
    del rec["topology"]
    lines[3] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    (lacking / "hashlog.jsonl").write_text("\n".join(lines) + "\n")
    cases.append((["--run", str(lacking), "--out", str(tmp_path / "s3")], "step 2 lacks ['topology']"))
    for args, says in cases:
        assert main(["audit", "site", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: ") and says in err and err.count("\n") == 1, err
    again = Path(shutil.copytree(site, tmp_path / "again"))
    assert main(["audit", "site", "--run", str(run), "--out", str(again), "--documents-steps", "0:0"]) == 0, \
        "an earlier site is replaced"
    assert json.loads((again / "site.json").read_text())["documents_steps"] == []
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".again")], "no temporary left behind"


def test_a_missing_corpus_is_said_in_the_step_view(run, tmp_path):
    s = build_site(run, tmp_path / "site", SiteOptions(corpus=str(tmp_path / "no-corpus")))
    assert s.documents == 0 and "corpus not found" in s.note and "no-corpus" in s.note
    view = _dom(tmp_path / "site" / "step.html", "?step=0")
    assert "corpus not found" in view and "Stage digests" in view


def test_mismatch_parts_name_the_tensor_and_element():
    import torch

    from replay.diff import first_difference

    a = torch.zeros(3, 4)
    b = a.clone()
    b[1, 2] = 0.5
    detail = (f"step 3 (1x1), clipped digest: logged {'1' * 64}, replay {'2' * 64}; against checkpoint "
              f"step-000000000004: {first_difference('grad/layers.0.wq', b, a)}")
    p = mismatch_parts(detail)
    assert (p["tensor"], p["element"], p["expected"], p["differing"]) == (
        "grad/layers.0.wq", "grad/layers.0.wq[1, 2]", "0.5 (0x3f000000)", "1 of 12")
    assert mismatch_parts("state hash: logged 1, replay 2") is None


def test_a_long_run_is_paged(run, tmp_path):
    """250 synthesized steps (benchmarks/site_build.py's run): the table renders 100 rows a page."""
    spec = importlib.util.spec_from_file_location("site_build", Path(__file__).parents[2] / "benchmarks" /
                                                  "site_build.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    long = bench.synthesize(run, tmp_path / "long", 250, mismatch_at=137)
    build_site(long, tmp_path / "site", SiteOptions(documents_steps="0:2"))
    dom = _dom(tmp_path / "site" / "steps.html")
    assert _rows(dom) == list(range(100)) and "250 of 250 steps; showing 1\u2013100" in dom
    assert _rows(_dom(tmp_path / "site" / "steps.html", "?from=200")) == list(range(200, 250))
    assert _rows(_dom(tmp_path / "site" / "steps.html", "?topology=2x1&status=MATCH"))[:2] == [125, 126]
    assert "FAILED at step 137" in _dom(tmp_path / "site" / "index.html")
    view = _dom(tmp_path / "site" / "step.html", "?step=5")  # outside --documents-steps: says how to list them
    assert "--documents-steps 5:6" in view and f"python -m app data inspect --run {long} --step 5" in view


def test_data_inspect_of_a_run_lists_what_the_step_view_lists(run, site, capsys):
    """`data inspect --run RUN --step N` takes the run's corpus, schedule and seed: its rows are the step view's."""
    from app.cli import main

    want = _data(site, "data/steps/000000.js")["steps"][1]["documents"]
    assert main(["data", "inspect", "--run", str(run), "--step", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"step": 1, **want}
    assert main(["data", "inspect", "--run", str(run), "--step", "1"]) == 0
    out = capsys.readouterr().out
    p = want["pieces"][0]
    assert "step 1: windows [2, 4)" in out and f"window {p['window']}, {p['source']} document {p['document']}:" in out
    assert main(["data", "inspect", "--run", str(run), "--step", "1", "--seed", "3"]) == 2
    assert "--seed: --run takes the schedule and seed from the run's config" in capsys.readouterr().err
    assert main(["data", "inspect", "--run", str(run), "--step", str(STEPS)]) == 2
    assert f"holds steps 0..{STEPS - 1}" in capsys.readouterr().err
