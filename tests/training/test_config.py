"""Configs: validation names the field, presets are valid, OPEN-1B counts 1.61B / 1.08B parameters."""
import pytest

import stream

from training.config import ModelConfig, MoEConfig, RunConfig, Topology, TrainConfig, from_dict
from training.errors import ConfigError
from training.params import count_params, param_specs
from training.presets import OPEN_1B, PRESETS, SMALL, preset


def test_open_1b_has_the_reports_parameter_counts():
    total, non_embedding = count_params(OPEN_1B.model)
    assert round(total / 1e9, 2) == 1.61
    assert round(non_embedding / 1e9, 2) == 1.08
    m = OPEN_1B.model
    assert (m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.ffn_hidden, m.vocab_size, m.seq_len) == \
        (24, 2048, 16, 4, 128, 5632, 128_256, 4096)
    assert (m.rope_theta, m.window, OPEN_1B.train.seed, OPEN_1B.train.z_loss) == (5e5, 512, 42, 1e-4)


def test_hybrid_attention_layout():
    m = OPEN_1B.model
    assert [i for i in range(m.n_layers) if m.is_global(i)] == [4, 9, 14, 19, 23]
    assert m.window_of(0) == 512 and m.window_of(4) is None


def test_small_is_about_100m():
    total, _ = count_params(SMALL.model)
    assert 90e6 < total < 110e6


def test_no_biases_and_every_linear_has_its_own_activation_step():
    specs = {s.name: s for s in param_specs(OPEN_1B.model)}
    assert not [n for n in specs if "bias" in n]
    linears = [n for n, s in specs.items() if s.kind == "linear"]
    assert len(linears) == 4 * 24
    assert all(specs[n.replace(".weight", ".s_x")].kind == "act_step" for n in linears)
    decayed = sorted({s.kind for s in specs.values() if s.decayed})
    assert decayed == ["head", "linear"]  # not embedding, norms or activation steps


@pytest.mark.parametrize("field,value", [("d_model", 0), ("n_kv_heads", 3), ("head_dim", 31), ("loss_chunk", 100),
                                         ("rope_theta", -1.0), ("head_slices", 5)])
def test_bad_model_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"model.{field}"):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("reduction", "fast"), ("micro_batch", 0), ("beta2", 1.5),
                                         ("batch_phases", ()), ("spike_skip", -1)])
def test_bad_train_values_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"train.{field}"):
        TrainConfig(**{field: value})


def test_moe_and_topology_validation():
    with pytest.raises(ConfigError, match="moe.top_k"):
        MoEConfig(n_experts=4, top_k=5)
    with pytest.raises(ConfigError, match="topology"):
        Topology.parse("2by2")
    assert Topology.parse("2x4").world == 8


def test_small_can_train_its_whole_schedule():
    """No step of small's LR budget (20,000 steps) reads the held-out slice, so 1,000-step runs are allowed."""
    t = SMALL.train
    batch = stream.BatchSchedule(SMALL.model.seq_len, tuple(stream.BatchPhase(u, w) for u, w in t.batch_phases))
    last = t.lr_budget_tokens // (SMALL.model.seq_len * t.batch_phases[-1][1]) - 1
    assert last == 19_999 and batch.window_range(last)[1] <= t.heldout_window


def test_presets_round_trip_through_json():
    for name, cfg in PRESETS.items():
        assert from_dict(cfg.to_dict()) == cfg, name
    with pytest.raises(ConfigError, match="--config"):
        preset("huge")
    assert isinstance(preset("tiny"), RunConfig)
