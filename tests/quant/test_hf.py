"""Hugging Face MoE checkpoints end to end: tiny Mixtral and Qwen2-MoE models (committed, built by
tests/quant/hf_models/build.py) quantized by the sequential pipeline (routing statistics, fit, PV, gates,
publish), loaded back into transformers, generate() run, held-out CE compared; bad input refused whole."""
import json
import shutil

import pytest
import torch

from app.cli import main
from kernels.digest import bits_equal
from quant import sequential, store
from quant.errors import ConfigError, FormatError, IntegrityError
from quant.format import decode
from quant.hf_acceptance import models, publish_both
from quant.hf_checkpoint import open_checkpoint
from quant.hf_loader import ArvqExperts, heldout_ce, load_quantized

from .conftest import HF_MODELS, hf_spec

MODELS = ("tiny-mixtral", "tiny-qwen2-moe")
CE_WINDOWS = 24


@pytest.fixture(scope="module")
def published(hf_donor, hf_data, tmp_path_factory):
    """name -> (ARVQ init output, ARVQ + PV output, cold experts per layer), each published by quant run."""
    return {name: publish_both(hf_spec(name, tmp_path_factory.mktemp(name)), hf_donor(name), hf_data)
            for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_quantized_model_generates_and_pv_beats_gptq(name, hf_donor, hf_data, published, capsys, record_property):
    init_out, pv_out, cold = published[name]
    donor = hf_donor(name)
    # routing statistics on the calibration split: the most-loaded expert of each layer stays hot
    load = donor.routing_load(hf_data)
    for layer, experts in cold.items():
        assert len(experts) == 3 and max(range(4), key=lambda e: (load[layer][e], -e)) not in experts
    held = hf_data["held_out"][:CE_WINDOWS]
    ms = models(donor, hf_data, cold, init_out, pv_out)
    ce = {k: heldout_ce(m, held) for k, m in ms.items()}
    record_property("heldout_ce", ce)  # in the JUnit report; printed too when the test runs alone (-s)
    with capsys.disabled():
        print(f"\n{name} held-out CE ({CE_WINDOWS} windows): " + ", ".join(f"{k} {v:.4f}" for k, v in ce.items()))
    q = ms["arvq_pv"]
    for layer in cold:
        experts = q.model.layers[layer].mlp.experts
        assert isinstance(experts, ArvqExperts) and sorted(experts.slot) == cold[layer]
        packed = store.load_layer(pv_out, layer)  # the module multiplies exactly the published weights
        e = cold[layer][-1]
        assert bits_equal(experts.decoded(e, "w2"), decode(packed["w2"], packed["w2"].slot(e)))
    assert all(abs(ce[k] - ce["unquantized"]) > 0 for k in ("rtn2", "gptq2", "arvq_pv"))  # the swap took effect
    assert abs(ce["arvq_pv"] - ce["unquantized"]) < abs(ce["gptq2"] - ce["unquantized"])
    ids = q.generate(input_ids=held[:1, :8], max_new_tokens=8, do_sample=False)
    assert ids.shape == (1, 16) and bool(((ids >= 0) & (ids < 512)).all())


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_missing_shard_is_refused_naming_it_and_nothing_is_published(tmp_path):
    ck = _copy(HF_MODELS / "tiny-mixtral", tmp_path / "ck")
    (ck / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FormatError) as exc:
        sequential.run(sequential.RunSpec(model=str(ck), out=str(tmp_path / "out")))
    assert "model-00002-of-00002.safetensors: missing shard" in _one_line(exc)
    assert not (tmp_path / "out").exists()


def test_unsupported_layout_is_refused_naming_the_config(tmp_path, capsys):
    ck = _copy(HF_MODELS / "tiny-qwen2-moe", tmp_path / "ck")
    cfg = json.loads((ck / "config.json").read_text())
    (ck / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ConfigError) as exc:
        sequential.run(sequential.RunSpec(model=str(ck), out=str(tmp_path / "out")))
    assert "config.json: model_type 'llama' is not a supported MoE layout" in _one_line(exc)
    assert not (tmp_path / "out").exists()
    assert main(["quant", "run", "--model", str(ck), "--out", str(tmp_path / "out")]) == 2  # the CLI: one line
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "config.json: model_type 'llama'" in err and "\n" not in err
    assert not (tmp_path / "out").exists()
    # an expert tensor absent from every shard is named too
    cfg_ok = _copy(HF_MODELS / "tiny-qwen2-moe", tmp_path / "ck2")
    idx = json.loads((cfg_ok / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.1.mlp.experts.3.up_proj.weight"] = "model-00003-of-00003.safetensors"
    (cfg_ok / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(FormatError, match="model-00003-of-00003.safetensors: missing shard"):
        open_checkpoint(cfg_ok)


def test_digest_mismatches_are_refused_naming_the_file(published, hf_donor, hf_data, tmp_path):
    _, pv_out, _ = published["tiny-mixtral"]
    # a published layer file changed: the loader names it, and no model is built
    out = _copy(pv_out, tmp_path / "arvq")
    f = out / "layer_0001" / "w2.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as exc:
        load_quantized(HF_MODELS / "tiny-mixtral", out)
    assert str(f) in _one_line(exc)
    # a rerun refuses the changed file, whether it would start from the cached trajectory or replay the layers
    before = (out / store.MANIFEST).read_bytes()
    for cached in (True, False):
        if not cached:
            shutil.rmtree(out / "cache")
        with pytest.raises(IntegrityError) as exc:
            sequential.run(hf_spec("tiny-mixtral", out), donor=hf_donor("tiny-mixtral"), data=hf_data)
        assert str(f) in _one_line(exc)
        assert (out / store.MANIFEST).read_bytes() == before
    # a checkpoint that is not the one quantized: the changed file is named
    ck = _copy(HF_MODELS / "tiny-mixtral", tmp_path / "ck")
    tok = json.loads((ck / "tokenizer.json").read_text())
    (ck / "tokenizer.json").write_text(json.dumps(tok, indent=2))
    with pytest.raises(IntegrityError) as exc:
        load_quantized(ck, pv_out)
    assert f"{ck / 'tokenizer.json'}: expected blake3" in _one_line(exc)


def test_a_run_directory_stays_a_project_donor(tmp_path):
    """A project run has a config.json too: its checkpoints/ makes it a run, never a Hugging Face checkpoint."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no checkpoints"):
        sequential.open_donor(str(run))


def _tiny_qwen3_moe(path):
    """A random-init Qwen3-MoE checkpoint built by transformers from a config (no download)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=128, intermediate_size=128, moe_intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=4,
                         num_experts_per_tok=2, eos_token_id=0, tie_word_embeddings=True)
    Qwen3MoeForCausalLM(cfg).save_pretrained(path)
    shutil.copy(HF_MODELS / "tiny-mixtral" / "tokenizer.json", path / "tokenizer.json")
    return path


@pytest.mark.parametrize("name", MODELS + ("qwen3-moe",))
def test_frozen_plus_cold_experts_is_the_transformers_layer(name, hf_donor, tmp_path):
    """block_parts' frozen part plus the cold experts in PV's arithmetic (float SwiGLU, BR GEMMs) with the
    checkpoint's own weights reproduces transformers' decoder layer, per layout."""
    from quant.hf_donor import load_hf_donor
    from quant.student import expert_forward
    donor = load_hf_donor(str(_tiny_qwen3_moe(tmp_path / "q3"))) if name == "qwen3-moe" else hf_donor(name)
    h = donor.embed(torch.arange(96).reshape(2, 48) * 5 % 512)
    ref = donor.block(0, h).reshape(-1, h.shape[-1])
    cold = [0, 2, 3]
    parts = donor.block_parts(0, h, cold)
    y = parts.frozen
    for e in cold:
        rows = torch.nonzero((parts.topk == e).any(dim=1)).flatten()
        gate = (parts.gates * (parts.topk == e)).sum(dim=1)[rows]
        w13, w2 = donor.expert_weights(0, e)
        y = y.index_add(0, rows, expert_forward(parts.f[rows], w13, w2, None) * gate[:, None])
    assert float((y - ref).norm() / ref.norm()) < 1e-5
    assert not torch.equal(parts.frozen, ref)  # the cold experts do contribute
