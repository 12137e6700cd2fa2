"""The sequential pipeline on tiny-moe: objective identities, PV non-regression and gates, publish, resume."""
import json

import pytest
import torch

from quant import layer as L, objective as obj, sequential
from quant.errors import ConfigError
from quant.donor import embed
from quant.expert_sum import Reducer
from quant.fit import FitConfig
from quant.pv import PVConfig
from quant.store import read_manifest

from .conftest import small_spec

COLD = {0: [0, 1, 2], 1: [1, 2, 3]}


def _problem(donor, data, target="reference", layer=0):
    traj = {s: (embed(donor, data[s][:, :-1]),) * 2 for s in obj.SPLITS}
    w = {s: obj.row_weights(data[s][:, 1:]) for s in obj.SPLITS}
    return L.build_problem(donor, layer, COLD[layer], traj, w, target, donor.rope())


def test_objective_identities(tiny_donor, tiny_data):
    p = _problem(tiny_donor, tiny_data)
    s = p.split("train")
    assert obj.reference_rel(s.required, s) < 1e-6          # supplying `required` reproduces the block
    assert abs(float(obj.loss(torch.zeros_like(s.f), s, p.denominator)) - 1.0) < 1e-5  # denominator = mean energy
    orig = {e: dict(zip(("w13", "w2"), tiny_donor.expert_weights(0, e))) for e in COLD[0]}
    assert L.rel_with_weights(p, orig, "val") < 1e-6        # donor's own experts: the donor's block
    # layer 0's student input is the reference input: both targets coincide there
    q = _problem(tiny_donor, tiny_data, "same_input")
    assert torch.equal(q.split("val").reference, p.split("val").reference)


def test_pv_never_publishes_a_regression(tiny_donor, tiny_data):
    p = _problem(tiny_donor, tiny_data)
    projs, _ = L.initial_fit(tiny_donor, p, FitConfig(sample_groups=1000))
    init, tuned = L.states_from(projs, p.cold), L.states_from(projs, p.cold)
    cfg = PVConfig(updates=4, microbatches=2, micro_rows=256, reassign_every=2, validate_every=2)
    res = L.tune_local(p, tuned, cfg)
    assert res["best_val_rel"] <= res["initial_val_rel"]
    for r in res["reassign"]:
        if r["joint_improved"]:
            assert r["train_sse_after"] < r["train_sse_before"]
    keep, g = L.gates(p, init, tuned, cfg)
    assert g["validation"] and g["val_final"] == res["best_val_rel"]
    assert g["kept"] == ("tuned" if g["audit"] else "initialization")
    _, rec = L.export_checked(p, keep, cfg)
    assert rec["replay"] and rec["replay_max_rel"] == 0.0   # the export decodes to the tuned weights exactly


def test_reducer_is_order_free(tiny_donor, tiny_data):
    gen = torch.Generator().manual_seed(0)
    parts = [torch.randn(37, 128, generator=gen) * 10 ** i for i in range(-2, 3)]
    a = Reducer().expert_sum(parts, (37, 128))
    b = Reducer().expert_sum(parts[::-1], (37, 128))
    assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def _digests(out):
    m = read_manifest(out)
    return {k: {p: v["blake3"] for p, v in rec["projections"].items()} for k, rec in m["layers"].items()}


def test_crash_then_resume_publishes_what_a_clean_run_does(tiny_donor, tiny_data, tmp_path, monkeypatch):
    clean = tmp_path / "clean"
    sequential.run(small_spec(clean, layers=(0, 1)), donor=tiny_donor, data=tiny_data, cold=COLD)
    want = _digests(clean)
    assert sorted(want) == ["0", "1"]
    out = tmp_path / "crashy"
    real = L.tune_local

    def dies_on_layer_1(problem, *a, **k):
        if problem.layer == 1:
            raise RuntimeError("simulated crash in layer 1")
        return real(problem, *a, **k)
    monkeypatch.setattr(L, "tune_local", dies_on_layer_1)
    with pytest.raises(RuntimeError, match="layer 1"):
        sequential.run(small_spec(out, layers=(0, 1)), donor=tiny_donor, data=tiny_data, cold=COLD)
    assert sorted(read_manifest(out)["layers"]) == ["0"]     # layer 0 published, layer 1 not
    monkeypatch.setattr(L, "tune_local", real)
    cache = out / "cache" / "after_0000.safetensors"
    cache.write_bytes(cache.read_bytes()[:-1] + b"\0")      # a damaged cache: replay layer 0 from its files
    sequential.run(small_spec(out, layers=(0, 1)), donor=tiny_donor, data=tiny_data, cold=COLD)
    assert _digests(out) == want
    with pytest.raises(ConfigError, match="another spec"):  # a different recipe never mixes into OUT
        sequential.run(small_spec(out, layers=(0, 1), target="same_input"), donor=tiny_donor, data=tiny_data,
                       cold=COLD)
    starts = [json.loads(x)["layer"] for x in (out / "run_log.jsonl").read_text().splitlines()
              if json.loads(x)["event"] == "layer_start"]
    assert starts == [0, 1, 1]                                # layer 0 was not redone
    resumes = [json.loads(x) for x in (out / "run_log.jsonl").read_text().splitlines()
               if json.loads(x)["event"] == "resume"]
    assert resumes[0]["from_cache"] is False                 # the damaged cache was refused, not used
