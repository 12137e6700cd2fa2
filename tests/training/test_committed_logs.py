"""The committed hash logs still come out byte for byte: the CPU `small-parity` log of docs/parity.md, retrained here
through its init record and first step (~1 minute on 2 cores). The log names the code version it was recorded by,
and that version is part of every state hash, so the run is made under the log's code version: what this checks is
that the computation is unchanged (a code change that alters no bit, such as moving a module, passes; one that
alters a bit fails). The log was trained from `data/demo`; this run reads the same corpus from the test's copy:
where the corpus lies is not part of the state hash."""
from __future__ import annotations

import json
from pathlib import Path

from training import train as train_mod
from training.presets import SMALL_PARITY
from training.rundir import HASHLOG
from training.train import TrainOptions, Trainer

LOG = Path(__file__).resolve().parents[2] / "docs" / "results" / "parity-small-parity-cpu-code1b2ec819.hashlog.jsonl"


def test_the_committed_cpu_log_comes_out_byte_identical(demo_corpus, tmp_path, monkeypatch):
    want = LOG.read_text().splitlines(keepends=True)
    monkeypatch.setattr(train_mod, "code_version", lambda: json.loads(want[0])["code_version"])
    cfg = SMALL_PARITY.replace(**{"train.corpus": str(demo_corpus)})
    t = Trainer(cfg, tmp_path / "run", TrainOptions(1, checkpoint_every=0, eval_every=0, progress=False))
    t.one_step()
    t.log.close()
    got = (tmp_path / "run" / HASHLOG).read_text().splitlines(keepends=True)
    assert got == want[:2]
