"""Checkpoints: exact round trip, corruption named, pickles refused, run directories never overwritten."""
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from training import checkpoint as ckpt, rundir
from training.config import ModelConfig, RunConfig, identity_json
from training.errors import CheckpointError, IntegrityError, RunDirError
from training.init import init_params
from training.params import spec_map
from training.state_hash import state_entries, state_hash
from training.step import TrainState
from training.train import TrainOptions, Trainer
from kernels.digest import digest_many

MINI = ModelConfig(vocab_size=97, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=16, ffn_hidden=48,
                   seq_len=16, window=8)
CFG = RunConfig("mini", MINI).to_dict()


def _saved(tmp_path: Path) -> tuple[Path, TrainState]:
    st = TrainState.fresh(init_params(MINI, 42))
    st.m["head.weight"].fill_(0.5)
    st.step, st.tokens, st.adam_step = 7, 700, 6
    sh = state_hash(state_entries(st, identity_json(CFG), "code", {"window": 3})).hex()
    return ckpt.save_checkpoint(tmp_path, st, CFG, "code", {"window": 3}, sh, "ab" * 32), st


def _load(path: Path):
    return ckpt.load_checkpoint(path, spec_map(MINI), "code")


def test_round_trip_is_bit_exact(tmp_path):
    path, st = _saved(tmp_path)
    assert path.name == "step-000000000007" and rundir.list_checkpoints(tmp_path) == [7]
    got, manifest = _load(path)
    for a, b in ((got.params, st.params), (got.m, st.m), (got.v, st.v), (got.grads, st.grads)):
        assert digest_many(a) == digest_many(b)
    assert (got.step, got.tokens, got.adam_step, manifest["chain_hash"]) == (7, 700, 6, "ab" * 32)
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        ckpt.save_checkpoint(tmp_path, st, CFG, "code", {"window": 3}, manifest["state_hash"], "ab" * 32)


def test_a_corrupted_file_fails_naming_the_file_and_both_digests(tmp_path):
    path, _ = _saved(tmp_path)
    f = path / "optim.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0x01  # one bit of one moment
    f.write_bytes(bytes(data))
    expected = json.loads((path / "manifest.json").read_text())["files"]["optim.safetensors"]
    with pytest.raises(IntegrityError) as e:
        _load(path)
    assert str(f) in str(e.value) and expected in str(e.value) and e.value.actual != expected


def test_a_tampered_manifest_state_is_refused(tmp_path):
    path, _ = _saved(tmp_path)
    m = json.loads((path / "manifest.json").read_text())
    m["tokens"] = 701  # digests of the files still match; the state no longer hashes to the manifest's
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match="state hash"):
        _load(path)


def test_a_pickle_payload_is_refused_even_with_a_matching_digest(tmp_path):
    path, st = _saved(tmp_path)
    f = path / "params.safetensors"
    torch.save(st.params, f)  # a zip of pickles
    m = json.loads((path / "manifest.json").read_text())
    m["files"]["params.safetensors"] = ckpt.file_digest(f)
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="pickle"):
        _load(path)
    f.write_bytes(pickle.dumps({"x": 1}, protocol=4))
    m["files"]["params.safetensors"] = ckpt.file_digest(f)
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(CheckpointError, match="pickle"):
        _load(path)


def test_unlisted_files_are_refused(tmp_path):
    path, st = _saved(tmp_path)
    torch.save({"evil": 1}, path / "extra.pt")
    with pytest.raises(CheckpointError, match="extra.pt"):
        _load(path)


def test_a_checkpoint_of_other_code_is_refused(tmp_path):
    path, _ = _saved(tmp_path)
    with pytest.raises(CheckpointError, match="code version"):
        ckpt.load_checkpoint(path, spec_map(MINI), "other")


def test_no_partial_checkpoint_is_ever_listed(tmp_path):
    (tmp_path / "checkpoints" / ".tmp-step-000000000009-1").mkdir(parents=True)
    assert rundir.list_checkpoints(tmp_path) == []


def test_an_existing_run_directory_is_never_overwritten(tiny, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="refusing to overwrite"):
        Trainer(tiny, out, TrainOptions(steps=1, progress=False))
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    with pytest.raises(RunDirError, match="--resume"):
        Trainer(tiny, tmp_path / "missing", TrainOptions(steps=1, progress=False), resume=True)
    shutil.rmtree(out)


def test_cli_refuses_an_existing_run_directory_with_a_clear_message(tiny, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "taken"
    out.mkdir()
    res = subprocess.run([sys.executable, "-m", "app", "train", "--config", "tiny", "--corpus", tiny.train.corpus,
                          "--steps", "1", "--out", str(out), "--no-progress"], cwd=Path(__file__).parents[2],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "RunDirError" in res.stderr and "--resume" in res.stderr
    assert list(out.iterdir()) == []
