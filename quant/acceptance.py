"""The ARVQ acceptance run on the project's own trained MoE; writes docs/quant.md and docs/results/arvq-acceptance.json.

    .venv/bin/python -m quant.acceptance --model runs/tiny-moe-arvq --work runs/arvq-acceptance

Runs the sequential pipeline three times into WORK (ARVQ init only: 0 PV updates; ARVQ + PV with the
reference target; ARVQ + PV with the same_input target, the ARVQ write-up's A/B), then measures end-to-end held-out
cross-entropy on the model's own held-out windows (training.evaluate's set, purged from the calibration
training split) with every layer's cold experts replaced: unquantized, RTN-2bit, GPTQ-2bit (Hessians from
the donor trajectory), ARVQ init, ARVQ + PV.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from training.evaluate import heldout_ce, heldout_tokens
from kernels.ref.loss import cross_entropy_zloss
from kernels.ref.rmsnorm import rmsnorm
from quant import baselines, calib, layer as L, objective as obj, sequential, store
from quant.donor import cold_from_load, donor_block, embed, expert_load, load_donor
from quant.hessian import expert_hessian
from quant.experts import PROJS
from quant.pv import PVConfig


def hybrid_ce(donor, ids: torch.Tensor, cold_w: dict[int, dict[int, dict[str, torch.Tensor]]]) -> float:
    """Mean held-out CE with each layer's cold experts replaced by the given float weights."""
    rope = donor.rope()
    h = embed(donor, ids[:, :-1])
    for layer in range(donor.cfg.model.n_layers):
        h = L.student_step(donor, layer, h, cold_w[layer], False, rope)
    p, m = donor.params, donor.cfg.model
    h = rmsnorm(h, p["final_norm.weight"], m.norm_eps)
    b, t, _ = h.shape
    _, ce, _ = cross_entropy_zloss(h.reshape(b * t, -1), p["head.weight"], ids[:, 1:].reshape(-1),
                                   z_weight=0.0, chunk=m.loss_chunk, slices=m.head_slices)
    return float(ce)


def scalar_baselines(donor, cold: dict, data: dict) -> dict[str, dict]:
    """{'rtn2'|'gptq2': layer -> expert -> proj -> weight}, GPTQ Hessians from the donor's own trajectory
    (any donor: the project's run or a Hugging Face checkpoint)."""
    rope = donor.rope()
    out = {"rtn2": {}, "gptq2": {}}
    h = {s: donor.embed(data[s][:, :-1]) for s in obj.SPLITS}
    for layer in range(donor.n_layers):
        w = {s: obj.row_weights(data[s][:, 1:], donor.separator) for s in obj.SPLITS}
        prob = L.build_problem(donor, layer, cold[layer], {s: (h[s], h[s]) for s in obj.SPLITS}, w, "reference",
                               rope)
        cap = L.capture_of(donor, prob)
        orig = {e: dict(zip(PROJS, donor.expert_weights(layer, e))) for e in cold[layer]}
        glob = {p: baselines.global_for([orig[e][p] for e in cold[layer]]) for p in PROJS}
        out["rtn2"][layer] = {e: {p: baselines.rtn(orig[e][p], glob[p]) for p in PROJS} for e in cold[layer]}
        out["gptq2"][layer] = {e: {p: baselines.gptq(orig[e][p], expert_hessian(cap, p, e).h, glob[p],
                                                     f"layer {layer} expert {e} {p}") for p in PROJS}
                               for e in cold[layer]}
        h = {s: donor.block(layer, h[s], rope) for s in obj.SPLITS}
    return out


def against_reference(donor, spec, data: dict, cold: dict) -> dict[int, dict[str, float]]:
    """val/audit reference_rel, against the *reference* target, of the layers a run published (whatever its
    own target): each layer on that run's student trajectory (its cache), with its published experts."""
    rope = donor.rope()
    traj = {s: (embed(donor, data[s][:, :-1]),) * 2 for s in obj.SPLITS}
    w = {s: obj.row_weights(data[s][:, 1:]) for s in obj.SPLITS}
    m = store.read_manifest(spec.out)
    out = {}
    for layer in range(donor.cfg.model.n_layers):
        prob = L.build_problem(donor, layer, cold[layer], traj, w, "reference", rope)
        pw = L.weights_of(store.load_layer(spec.out, layer), cold[layer])
        out[layer] = {s: L.rel_with_weights(prob, pw, s) for s in ("val", "audit")}
        traj = sequential._load_cache(Path(spec.out), layer, m["layers"][str(layer)]["meta"]["cache_blake3"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="runs/tiny-moe-arvq")
    ap.add_argument("--work", default="runs/arvq-acceptance")
    ap.add_argument("--docs", default="docs")
    ap.add_argument("--updates", type=int, default=69)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--render", default=None, help="only re-render docs/quant.md from this results JSON")
    a = ap.parse_args(argv)
    if a.render:
        (Path(a.docs) / "quant.md").write_text(render(json.loads(Path(a.render).read_text())))
        return 0
    torch.set_num_threads(a.threads)
    t0 = time.time()
    work = Path(a.work)
    donor = load_donor(a.model)
    cold = cold_from_load(expert_load(a.model), 1)
    base = sequential.RunSpec(model=a.model, out="", pv=replace(PVConfig(), updates=a.updates))
    variants = {"arvq_init": replace(base, out=str(work / "init"), pv=replace(base.pv, updates=0, reassign_every=0)),
                "arvq_pv": replace(base, out=str(work / "pv-reference")),
                "arvq_pv_same_input": replace(base, out=str(work / "pv-same-input"), target="same_input"),
                "arvq_pv_scales_fast": replace(base, out=str(work / "pv-scales-0.002"),
                                               pv=replace(base.pv, lr_scales=0.002))}
    recs = {k: sequential.run(spec) for k, spec in variants.items()}
    held = heldout_tokens(donor.cfg)
    data = calib.build(replace(base.calib, corpus=donor.cfg.train.corpus, seq_len=donor.cfg.model.seq_len),
                       extra_held_out=held)
    cross = {k: against_reference(donor, variants[k], data, cold) for k in ("arvq_pv", "arvq_pv_same_input")}
    weights = {"unquantized": {l: {e: dict(zip(PROJS, donor.expert_weights(l, e))) for e in cold[l]}
                               for l in cold}}
    weights.update(scalar_baselines(donor, cold, data))
    for k in ("arvq_init", "arvq_pv", "arvq_pv_same_input", "arvq_pv_scales_fast"):
        weights[k] = {l: L.weights_of(store.load_layer(variants[k].out, l), cold[l]) for l in cold}
    ce = {"donor": heldout_ce(donor.params, donor.cfg, held)}
    ce.update({k: hybrid_ce(donor, held, w) for k, w in weights.items()})
    rows = []
    for layer in sorted(recs["arvq_pv"]):
        r, ri, rs = recs["arvq_pv"][layer], recs["arvq_init"][layer], recs["arvq_pv_same_input"][layer]
        rows.append({"layer": layer, "cold": r["cold"], "rtn2": r["val_rel"]["rtn2"], "gptq2": r["val_rel"]["gptq2"],
                     "arvq_init": r["val_rel"]["arvq_init"], "arvq_pv": r["val_rel"]["arvq_pv"],
                     "init_pipeline_val": ri["val_rel"]["arvq_pv"], "gates": r["gates"], "pv": r["pv"],
                     "reassign": r["reassign"], "same_input": {"val_own_target": rs["gates"]["val_final"],
                     "audit_own_target": rs["gates"]["audit_final"], "kept": rs["gates"]["kept"],
                     "val": cross["arvq_pv_same_input"][layer]["val"],
                     "audit": cross["arvq_pv_same_input"][layer]["audit"]},
                     "reference_check": cross["arvq_pv"][layer],
                     "scales_fast": {"val": recs["arvq_pv_scales_fast"][layer]["gates"]["val_final"],
                                     "best_update": recs["arvq_pv_scales_fast"][layer]["pv"]["best_update"],
                                     "history": recs["arvq_pv_scales_fast"][layer]["history"]},
                     "history": r["history"],
                     "seconds": r["seconds"]})
    result = {"command": f".venv/bin/python -m quant.acceptance --model {a.model} --work {a.work}",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.processor() or
              platform.machine(), "torch": torch.__version__, "donor": donor.source, "cold": cold,
              "pv_config": recs["arvq_pv"][0]["spec"]["pv"], "layers": rows, "heldout_ce": ce,
              "seconds": time.time() - t0}
    docs = Path(a.docs)
    (docs / "results").mkdir(parents=True, exist_ok=True)
    (docs / "results" / "arvq-acceptance.json").write_text(json.dumps(result, indent=1) + "\n")
    (docs / "quant.md").write_text(render(result))
    print(render(result))
    return 0


def render(r: dict) -> str:
    from quant.report import render as _render
    return _render(r)


if __name__ == "__main__":
    raise SystemExit(main())
