"""The docs say what holds now and stand on files the repository has: the two figure pages stay a page each, every
results file they name exists, and docs/results/ holds nothing the docs do not cite."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = ("docs/perf.md", "docs/parity.md")
# a file name as the docs write one: `name.ext` or docs/results/name.ext
CITED = re.compile(r"(?:docs/results/|`)([\w.+-]+\.(?:json|jsonl|txt|xml|png))\b")
RUN_FILES = {"hashlog.jsonl", "metrics.jsonl", "config.json", "run.json", "manifest.json", "report.json"}  # a run's


def _cited(text: str) -> set[str]:
    return set(CITED.findall(text)) - RUN_FILES


@pytest.mark.parametrize("page", PAGES)
def test_figure_pages_are_a_page_and_cite_existing_results(page):
    text = (ROOT / page).read_text()
    assert len(text.splitlines()) < 300, f"{page}: {len(text.splitlines())} lines; it says what holds now, in a page"
    missing = [n for n in sorted(_cited(text))
               if not (RESULTS / n).is_file() and not (ROOT / "docs" / n).is_file() and not list(ROOT.glob(f"*/{n}"))]
    assert not missing, f"{page} cites files the repository lacks: {missing}"


def test_every_results_file_is_cited():
    cited: set[str] = set()
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        cited |= _cited(doc.read_text())
    uncited = sorted(p.name for p in RESULTS.iterdir() if p.name not in cited)
    assert not uncited, f"docs/results/ holds files no doc cites: {uncited}"
