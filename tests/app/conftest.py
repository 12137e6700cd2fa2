"""Shared fixtures: the embedded demo corpus built once per session in a temporary directory."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.config import RunConfig
from app.presets import TINY


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo corpus (vocab 4096), built from this interpreter's standard library (~3 s)."""
    from stream import build_demo

    out = tmp_path_factory.mktemp("demo-corpus")
    build_demo(out, vocab_size=TINY.model.vocab_size, progress=False)
    return out


@pytest.fixture(scope="session")
def tiny(demo_corpus: Path) -> RunConfig:
    """The tiny preset reading the session's corpus."""
    return TINY.replace(**{"train.corpus": str(demo_corpus)})
