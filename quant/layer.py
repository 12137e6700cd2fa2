"""One layer of the sequential pipeline: the problem from the two trajectories, the initial fit, the 2-bit
baselines, PV tuning (in-process or on a gang), and the gates (the ARVQ write-up, sections 4-7).

Gates, recorded per layer:
  validation   0 <= final val reference_rel <= initial * (1 + 1e-6)
  audit        audit reference_rel of the tuned experts <= that of the initialization * (1 + 1e-6); on
               failure the layer keeps its initialization (the audit split is never used for updates or
               for choosing the best update)
  replay       the packed export, parsed back from its bytes, decodes to a forward within 2e-6 (max abs,
               relative to max |output|) of the tuned forward on the validation split
"""
from __future__ import annotations

import torch

from quant import baselines, objective as obj, store
from quant.capture import LayerCapture
from quant.donor import Donor
from quant.errors import FitError
from quant.expert_sum import Reducer
from quant.fit import FitConfig, fit_projection
from quant.hessian import expert_hessian
from quant.format import decode
from quant.experts import PROJS, ExpertState
from quant.pv import PVConfig, Tuner
from quant.student import Latent, expert_forward, to_projection

GATE_TOL = 1e-6
REPLAY_TOL = 2e-6


def build_problem(donor: Donor, layer: int, cold: list[int], traj: dict, weights: dict, target: str,
                  rope) -> obj.LayerProblem:
    """traj[split] = (h_student, h_reference) [W, T, D]; weights[split] = row weights [W*T]."""
    if target not in obj.TARGETS:
        raise FitError(f"layer {layer}", f"--target must be one of {obj.TARGETS}, got {target!r}")
    splits = {}
    for name, (hs, hr) in traj.items():
        parts = donor.block_parts(layer, hs, cold, rope)
        ref_in = hr if target == "reference" else hs
        ref = donor.block(layer, ref_in, rope).reshape(parts.f.shape)
        splits[name] = obj.Split(parts.f, parts.topk, parts.gates, parts.frozen, ref, weights[name])
    return obj.make_problem(layer, cold, splits, donor.act_steps(layer, cold))


def capture_of(donor: Donor, problem: obj.LayerProblem) -> LayerCapture:
    """The training split as quant.capture's LayerCapture (for the Hessians and the baselines)."""
    s = problem.split("train")
    w13 = torch.stack([donor.expert_weights(problem.layer, e)[0] for e in range(donor.n_experts)])
    w2 = torch.stack([donor.expert_weights(problem.layer, e)[1] for e in range(donor.n_experts)])
    return LayerCapture(problem.layer, s.f, s.topk, s.gates, w13, w2, torch.zeros(s.f.shape[0], dtype=torch.int64))


def initial_fit(donor: Donor, problem: obj.LayerProblem, cfg: FitConfig) -> tuple[dict, dict]:
    """({proj: RVQProjection}, {proj: Hessians}) of the cold experts."""
    cap = capture_of(donor, problem)
    projs, hess = {}, {}
    for proj in PROJS:
        hs = [expert_hessian(cap, proj, e, cfg.min_tokens).h for e in problem.cold]
        ws = [cap.weight(proj, e) for e in problem.cold]
        projs[proj], _ = fit_projection(ws, hs, problem.cold, layer=problem.layer, projection=proj, cfg=cfg)
        hess[proj] = hs
    return projs, hess


def states_from(projs: dict, cold: list[int]) -> list[ExpertState]:
    return [ExpertState(e, {p: Latent.from_projection(projs[p], i) for p in PROJS}) for i, e in enumerate(cold)]


def rel_with_weights(problem: obj.LayerProblem, weights: dict[int, dict[str, torch.Tensor]], split: str,
                     emulate: bool = False) -> float:
    """reference_rel on a split with explicit float weights per cold expert (baselines, unquantized)."""
    s = problem.split(split)
    with torch.no_grad():
        parts = [_contrib(s, e, w["w13"], w["w2"], problem.act_steps[e], emulate) for e, w in weights.items()]
    return obj.reference_rel(Reducer().expert_sum(parts, tuple(s.f.shape)), s)


def _contrib(s: obj.Split, e: int, w13: torch.Tensor, w2: torch.Tensor, steps, emulate: bool) -> torch.Tensor:
    rows, gate = s.routed(e)
    y = expert_forward(s.f[rows], w13, w2, steps, emulate) * gate[:, None]
    return torch.zeros(s.f.shape, dtype=torch.float32).index_add(0, rows, y)


def baseline_rels(donor: Donor, problem: obj.LayerProblem, hess: dict, emulate: bool) -> dict:
    """val reference_rel of the unquantized cold experts (float path), RTN-2bit and GPTQ-2bit."""
    orig = {e: dict(zip(PROJS, donor.expert_weights(problem.layer, e))) for e in problem.cold}
    out = {"unquantized": rel_with_weights(problem, orig, "val", emulate)}
    glob = {p: baselines.global_for([orig[e][p] for e in problem.cold]) for p in PROJS}
    rtn = {e: {p: baselines.rtn(orig[e][p], glob[p]) for p in PROJS} for e in problem.cold}
    gptq = {e: {p: baselines.gptq(orig[e][p], hess[p][i], glob[p], f"layer {problem.layer} expert {e} {p}")
                for p in PROJS} for i, e in enumerate(problem.cold)}
    out["rtn2"] = rel_with_weights(problem, rtn, "val", emulate)
    out["gptq2"] = rel_with_weights(problem, gptq, "val", emulate)
    out["_weights"] = {"rtn2": rtn, "gptq2": gptq}
    return out


def tune_local(problem: obj.LayerProblem, states: list[ExpertState], cfg: PVConfig, log=None) -> dict:
    return Tuner(problem, states, Reducer(), cfg, log).run()


def gates(problem: obj.LayerProblem, init: list[ExpertState], tuned: list[ExpertState],
          cfg: PVConfig) -> tuple[list[ExpertState], dict]:
    """The validation and audit gates; (the states to publish, the gate record)."""
    t_init = Tuner(problem, init, Reducer(), cfg)
    t_tuned = Tuner(problem, tuned, Reducer(), cfg)
    val0, val1 = t_init.rel("val"), t_tuned.rel("val")
    aud0, aud1 = t_init.rel("audit"), t_tuned.rel("audit")
    g = {"val_initial": val0, "val_final": val1, "audit_initial": aud0, "audit_final": aud1,
         "validation": 0.0 <= val1 <= val0 * (1 + GATE_TOL), "audit": aud1 <= aud0 * (1 + GATE_TOL)}
    keep = tuned if g["validation"] and g["audit"] else init
    g["kept"] = "tuned" if keep is tuned else "initialization"
    return keep, g


def export_checked(problem: obj.LayerProblem, states: list[ExpertState], cfg: PVConfig) -> tuple[dict, dict]:
    """(projections, replay record): the export parsed back from its bytes must reproduce the forward."""
    projs = {p: to_projection([s.lat[p] for s in states], problem.cold) for p in PROJS}
    back = {p: store.from_bytes(store.to_bytes(projs[p], problem.layer, p), f"layer {problem.layer} {p}")
            for p in PROJS}
    y0 = Tuner(problem, states, Reducer(), cfg).coupled("val")
    y1 = Tuner(problem, states_from(back, problem.cold), Reducer(), cfg).coupled("val")
    err = float((y1 - y0).abs().max() / y0.abs().max().clamp(min=1e-30))
    rec = {"replay_max_rel": err, "replay": err < REPLAY_TOL}
    if not rec["replay"]:
        raise FitError(f"layer {problem.layer}", f"serialized replay differs from the tuned forward by {err:.3g} "
                                                 f"(limit {REPLAY_TOL}); not publishing")
    return projs, rec


def student_step(donor: Donor, layer: int, h: torch.Tensor, cold_w: dict[int, dict[str, torch.Tensor]],
                 emulate: bool, rope) -> torch.Tensor:
    """The hybrid block on residual h [W, T, D]: frozen + the given cold experts (student trajectory)."""
    parts = donor.block_parts(layer, h, list(cold_w), rope)
    s = obj.Split(parts.f, parts.topk, parts.gates, parts.frozen, parts.frozen, torch.ones(parts.f.shape[0]))
    with torch.no_grad():
        steps = donor.act_steps(layer, list(cold_w))
        cold = Reducer().expert_sum([_contrib(s, e, w["w13"], w["w2"], steps[e], emulate)
                                     for e, w in cold_w.items()], tuple(parts.f.shape))
    return (parts.frozen + cold).reshape(h.shape)


def weights_of(projs: dict, cold: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """expert -> projection -> decoded float32 weight, from packed projections."""
    return {e: {p: decode(projs[p], i) for p in PROJS} for i, e in enumerate(cold)}

