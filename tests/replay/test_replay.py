"""Single-device replay: clean tiny runs replay MATCH (from the initialization, from a checkpoint, on a virtual
2x2 mesh with the ordered fold), and the four tampers are each caught where they should be: a poisoned window
(forward, at its step), a flipped checkpoint bit (refused, naming the file), an edited log hash (state / chain,
at its step) and a run recorded with non-deterministic collectives (refused)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import zstandard

from training.config import Topology
from training.errors import IntegrityError
from training.presets import TINY
from training.train import TrainOptions, train
from replay import replay_segment
from replay.errors import AuditRefused

torch.set_num_threads(1)  # 2 shared cores: torch's thread pool spins against the other processes


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from stream import build_demo

    out = tmp_path_factory.mktemp("corpus")
    build_demo(out, vocab_size=TINY.model.vocab_size, progress=False)
    return out


def _train(cfg, out: Path, steps: int, every: int, topology: str = "1x1") -> Path:
    train(cfg, out, TrainOptions(steps=steps, checkpoint_every=every, eval_every=0, topology=Topology.parse(topology),
                                 progress=False))
    return out


@pytest.fixture(scope="module")
def run12(corpus, tmp_path_factory) -> Path:
    """tiny, 12 steps, checkpoints after steps 4, 8 and 12."""
    return _train(TINY.replace(**{"train.corpus": str(corpus)}), tmp_path_factory.mktemp("runs") / "r12", 12, 4)


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst)
    return dst


def _edit_log(run: Path, step: int, **fields) -> None:
    path = run / "hashlog.jsonl"
    lines = path.read_text().splitlines()
    rec = json.loads(lines[step + 1])
    rec.update(fields)
    lines[step + 1] = json.dumps(rec, sort_keys=True, separators=(",", ":"))
    path.write_text("\n".join(lines) + "\n")


def test_clean_run_matches_from_init_and_from_a_checkpoint(run12):
    log = [json.loads(x) for x in (run12 / "hashlog.jsonl").read_text().splitlines()]
    r = replay_segment(run12, 0, 12)
    assert (r.verdict, r.mismatch, r.steps_replayed, r.start_step) == ("MATCH", None, 12, 0)
    assert r.computed_chain == r.expected_chain == r.run_hash == log[-1]["chain_hash"]
    r = replay_segment(run12, 9, 11)  # starts from checkpoint 8, certifies steps 9 and 10
    assert (r.verdict, r.start_step, r.steps_replayed) == ("MATCH", 8, 3)
    assert r.computed_chain == log[11]["chain_hash"]


def test_cli_exit_status_and_verdict(run12, capsys, tmp_path):
    from app.cli import main

    assert main(["audit", "replay", "--run", str(run12), "--until-step", "9", "--from-checkpoint", "8",
                 "--no-progress"]) == 0
    assert "MATCH" in capsys.readouterr().out
    bad = _copy(run12, tmp_path / "bad")
    _edit_log(bad, 9, state_hash="ab" * 32)
    assert main(["audit", "replay", "--run", str(bad), "--until-step", "9", "--from-checkpoint", "8",
                 "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH at step 9, stage state" in out
    assert main(["audit", "replay", "--run", str(bad), "--until-step", "9", "--from-checkpoint", "5"]) == 2


def test_virtual_2x2_ordered_run_matches(corpus, tmp_path):
    cfg = TINY.replace(**{"train.corpus": str(corpus), "train.batch_phases": ((1 << 50, 4),), "train.micro_batch": 1,
                          "train.reduction": "ordered"})
    run = _train(cfg, tmp_path / "r2x2", 3, 2, "2x2")
    assert json.loads((run / "run.json").read_text())["collectives"] == "ordered"
    assert json.loads((run / "hashlog.jsonl").read_text().splitlines()[1])["topology"] == "2x2"
    r = replay_segment(run, 0, 3)
    assert r.verdict == "MATCH" and r.computed_chain == r.run_hash


# -- (a) one window's tokens poisoned at step k -------------------------------------------------------------
def _poison(corpus: Path, cfg, steps: range) -> tuple[int, str]:
    """Swap two words of a document feeding step `step` (same token count, changed tokens all inside the step's
    windows, the document begun in them), re-compress the shard and update the manifest consistently; returns
    (the step, the shard's path)."""
    import stream
    from training.step import schedules
    from stream.provenance import step_provenance
    from stream.tokenizer import load_tokenizer

    s = stream.open_stream(corpus, seq_len=cfg.model.seq_len, seed=cfg.train.seed)
    tok = load_tokenizer(corpus / s.manifest.tokenizer_path)
    rows = [row for step in steps for row in step_provenance(s, schedules(cfg)[0], step)]
    for row in rows:
        if row["tokens"][0] != 0:
            continue  # a document begun earlier is in earlier stream states (their partial-document digest)
        shard = corpus / row["shard"]
        raw = zstandard.ZstdDecompressor().decompress(shard.read_bytes())
        b0, b1 = row["span"]
        doc = json.loads(raw[b0:b1])
        words = doc["text"].split(" ")
        old, _ = tok.encode_documents([doc["text"]])
        for i in range(len(words) - 1):
            if not words[i] or not words[i + 1] or words[i] == words[i + 1]:
                continue
            w = words[:i] + [words[i + 1], words[i]] + words[i + 2:]
            new, _ = tok.encode_documents([" ".join(w)])
            diff = (old != new).nonzero()[0] if old.size == new.size else None
            if diff is None or not diff.size or diff[0] < row["tokens"][0] or diff[-1] >= row["tokens"][1]:
                continue
            line = json.dumps({**doc, "text": " ".join(w)}, ensure_ascii=False, separators=(",", ":")).encode()
            if raw[b0:b0 + len(line)] == line or raw[b0 + len(line):b0 + len(line) + 1] not in (b"\n", b""):
                continue  # the swap must keep the record's byte length (other documents' spans unchanged)
            data = zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw[:b0] + line + raw[b0 + len(line):])
            shard.write_bytes(data)
            from stream.fileio import blake3_bytes
            m = json.loads((corpus / "manifest.json").read_text())
            for src in m["sources"]:
                for e in src["shards"]:
                    if e["path"] == row["shard"]:
                        e["blake3"], e["bytes"] = blake3_bytes(data), len(data)
            (corpus / "manifest.json").write_text(json.dumps(m, indent=1, sort_keys=True))
            return row["step"], row["shard"]
    raise AssertionError(f"no word swap found that stays inside one of steps {steps}")


def test_poisoned_window_is_refused_by_default_and_named_forward_at_its_step(tmp_path, corpus):
    own = shutil.copytree(corpus, tmp_path / "corpus")
    cfg = TINY.replace(**{"train.corpus": str(own)})
    run = _train(cfg, tmp_path / "run", 8, 8)
    k, shard = _poison(own, cfg, range(1, 7))
    with pytest.raises(AuditRefused, match=f"{own / 'manifest.json'}.*not the run's corpus"):
        replay_segment(run, 0, 8)  # the config's corpus: run.json names another manifest
    r = replay_segment(run, 0, 8, corpus=own)  # pointed at the copy deliberately: the tokens are audited
    assert r.verdict == "MISMATCH" and (r.mismatch.step, r.mismatch.stage) == (k, "forward"), r.mismatch
    assert r.steps_replayed == k + 1 and any(shard in n for n in r.notes), r.notes


# -- (b) one bit flipped in a checkpoint ---------------------------------------------------------------------
@pytest.mark.parametrize("name", ["params.safetensors", "grads.safetensors"])
def test_flipped_checkpoint_bit_is_refused_before_replay(run12, tmp_path, name):
    run = _copy(run12, tmp_path / "run")
    f = run / "checkpoints" / "step-000000000008" / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=str(f)):
        replay_segment(run, 8, 10)


# -- (c) one hash edited in the log --------------------------------------------------------------------------
def test_edited_state_hash_is_a_mismatch_at_that_step(run12, tmp_path):
    run = _copy(run12, tmp_path / "run")
    _edit_log(run, 7, state_hash="00" * 32)
    r = replay_segment(run, 4, 12)
    assert r.verdict == "MISMATCH" and (r.mismatch.step, r.mismatch.stage) == (7, "state")
    # the run's own checkpoint after step 7 agrees with the replay, not with the edited record
    assert "edited log?" in r.mismatch.detail and r.steps_replayed == 4 and r.computed_chain == ""


def test_edited_chain_hash_is_a_mismatch_at_that_step(run12, tmp_path):
    run = _copy(run12, tmp_path / "run")
    _edit_log(run, 5, chain_hash="11" * 32)
    r = replay_segment(run, 4, 8)
    assert (r.mismatch.step, r.mismatch.stage) == (5, "chain")


def test_edited_loss_is_named_loss_and_a_checkpoint_that_disagrees_with_the_log_is_a_mismatch(run12, tmp_path):
    run = _copy(run12, tmp_path / "run")
    _edit_log(run, 4, loss=1.5)
    r = replay_segment(run, 4, 5)
    assert (r.mismatch.step, r.mismatch.stage) == (4, "loss") and "logged 1.5" in r.mismatch.detail
    _edit_log(run, 3, chain_hash="22" * 32)  # the record checkpoint 4 continues from
    r = replay_segment(run, 4, 5)
    assert (r.mismatch.step, r.mismatch.stage, r.steps_replayed) == (3, "chain", 0)


# -- (d) non-deterministic collectives ----------------------------------------------------------------------
def test_run_with_native_collectives_is_refused(run12, tmp_path):
    from app.cli import main

    run = _copy(run12, tmp_path / "run")
    desc = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**desc, "collectives": "native", "auditable": False}))
    with pytest.raises(AuditRefused, match="non-deterministic"):
        replay_segment(run, 0, 1)
    assert main(["audit", "replay", "--run", str(run), "--until-step", "0"]) == 2
    run2 = _copy(run12, tmp_path / "run2")
    _edit_log(run2, 6, collectives="native", auditable=False)
    with pytest.raises(AuditRefused, match="step 6 was recorded with collectives 'native'"):
        replay_segment(run2, 0, 1)


def test_altered_run_directory_copy_is_refused(run12, tmp_path):
    run = _copy(run12, tmp_path / "run")
    (run / "data" / "tokenizer.json").write_bytes((run / "data" / "tokenizer.json").read_bytes() + b" ")
    with pytest.raises(AuditRefused, match="tokenizer.json"):
        replay_segment(run, 0, 1)


def test_replay_refuses_a_bad_device_by_name(run12):
    from training.errors import ConfigError

    with pytest.raises(ConfigError, match="device 'gpu'"):
        replay_segment(run12, 0, 1, device="gpu")
