"""Output-gradient index reassignment with prefix backtracking (the ARVQ write-up, section 6.1).

Adam cannot move the discrete (a, b) pairs; every `reassign_every` updates, per expert projection:
  1. backprop the output loss (sum_i w_i ||cold_i - required_i||^2 on a training batch) to the expert's
     reconstructed weight W; in normalized units g = dL/dv per group, v = c0[a] + c1[b];
  2. a small gradient step t = v - eta g with eta = trust_ratio * ||v|| / ||g||; among the target_ratio
     share of groups with the largest ||g||, the single-swap alternatives (a', b), (a, b') are ranked by
     distance to t and, of the NEAR closest, the one with the largest first-order gain -<g, v' - v> is
     the group's proposal (only if that gain is positive: keeping the current pair is always legal);
     proposals rank by gain, at most max_fraction of the groups (at least one). (Ours: on this model the
     nearest alternative is ~33% of a group's norm away, so "nearest to a 1% step" would never move.)
  3. prefix backtracking: the top k for k in {all, 1/4, 1/16, 1}: accept the first k for which the
     training SSE strictly drops and a separate check batch's SSE does not rise beyond 1e-7 (relative).
Experts are judged against the same coupled output (Jacobi: an expert's verdict never depends on which
other experts share its actor); one joint re-check after all experts reverts the round if the combined
change fails the same test. All distances are 8-term sums in a fixed order; sorts are stable: BR.
"""
from __future__ import annotations

import math

import torch

from kernels.ref.elementary import sqrt_
from kernels.ref.reduce import exact_sum
from quant import objective as obj
from quant.experts import PROJS, contribution
from quant.format import GROUP, GROUPS_PER_BLOCK
from quant.fp_formats import e4m3_decode

F32 = torch.float32
NEAR = 8  # alternatives per group considered around the gradient step (ours)


def _sum8(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (8) in a fixed left-to-right order: elementwise adds only."""
    acc = x[..., 0]
    for j in range(1, x.shape[-1]):
        acc = acc + x[..., j]
    return acc


def _first_max(d: torch.Tensor) -> torch.Tensor:
    """Index of the first maximum per row (ties to the lower index, whatever the device)."""
    m = torch.amax(d, dim=1, keepdim=True)
    pos = torch.arange(d.shape[1], device=d.device).expand_as(d)
    return torch.amin(torch.where(d == m, pos, torch.full_like(pos, d.shape[1])), dim=1)


def propose(lat, gw: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """(group ids [P], new pairs [P, 2]) ranked by predicted gain, for weight gradient gw [N, K]."""
    n, k = gw.shape
    atoms = lat.atoms()
    idx = lat.idx.reshape(-1, 2)
    s = e4m3_decode(lat.scale_codes()) * lat.glob
    g = (gw.reshape(n, k // GROUP, GROUP) * s.repeat_interleave(GROUPS_PER_BLOCK, dim=1).unsqueeze(-1))
    g = g.reshape(-1, GROUP)
    v = atoms[0][idx[:, 0]] + atoms[1][idx[:, 1]]
    gnorm = _sum8(g * g)
    vn, gn = sqrt_(exact_sum(_sum8(v * v), dim=0)), sqrt_(exact_sum(gnorm, dim=0))
    if not float(gn) > 0:
        return (torch.zeros(0, dtype=torch.int64, device=gw.device),
                torch.zeros(0, 2, dtype=torch.int64, device=gw.device))
    eta = torch.tensor(cfg.trust_ratio, dtype=F32) * (vn / gn)
    m = idx.shape[0]
    look = max(1, math.ceil(cfg.target_ratio * m))
    sel = torch.sort(gnorm, descending=True, stable=True).indices[:look]
    t = v[sel] - eta * g[sel]                                                   # [S, 8]
    a, b = idx[sel, 0], idx[sel, 1]
    ca = atoms[0].unsqueeze(0) + atoms[1][b].unsqueeze(1)                       # [S, 256, 8]: (a', b)
    cb = atoms[0][a].unsqueeze(1) + atoms[1].unsqueeze(0)                       # [S, 256, 8]: (a, b')
    cand = torch.cat([ca, cb], dim=1)                                          # [S, 512, 8]
    d = _sum8((t.unsqueeze(1) - cand) ** 2)
    ids = torch.arange(256, device=a.device)
    same = torch.cat([ids.expand(len(a), 256) == a[:, None], ids.expand(len(b), 256) == b[:, None]], dim=1)
    d = torch.where(same, torch.full_like(d, float("inf")), d)                  # alternatives only
    near = torch.sort(d, dim=1, stable=True).indices[:, :NEAR]                  # the NEAR closest to t
    gain_all = -_sum8(g[sel].unsqueeze(1) * (cand - v[sel].unsqueeze(1)))      # first-order gain
    gn_near = gain_all.gather(1, near)
    j = near.gather(1, _first_max(gn_near).unsqueeze(1)).squeeze(1)
    na = torch.where(j < 256, j, a)
    nb = torch.where(j < 256, b, j - 256)
    changed = (na != a) | (nb != b)
    gain = gain_all.gather(1, j.unsqueeze(1)).squeeze(1)
    ok = changed & (gain > 0)
    groups, gain, pairs = sel[ok], gain[ok], torch.stack([na, nb], dim=1)[ok]
    order = torch.sort(gain, descending=True, stable=True).indices[:max(1, math.floor(cfg.max_fraction * m))]
    return groups[order], pairs[order]


def _prefixes(p: int) -> list[int]:
    out = []
    for k in (p, math.ceil(p / 4), math.ceil(p / 16), 1):
        if 0 < k <= p and k not in out:
            out.append(k)
    return out


def reassign(tuner, train_rows: torch.Tensor, check_rows: torch.Tensor) -> dict:
    """One reassignment pass over the tuner's experts; returns counts and the SSEs."""
    cfg, p = tuner.cfg, tuner.p
    st, sc = p.split("train").take(train_rows), p.split("train").take(check_rows)
    y_t, y_c = tuner.coupled("train", train_rows), tuner.coupled("train", check_rows)
    base_t, base_c = obj.sse(y_t, st), obj.sse(y_c, sc)
    slack = torch.tensor(1.0 + cfg.slack, dtype=F32)
    changes, stats = [], {"proposed": 0, "accepted": 0, "projections_accepted": 0}
    for es in tuner.experts:
        if es.frozen:
            continue
        steps = p.act_steps[es.expert]
        cur_t, cur_c, sse_t, sse_c = y_t, y_c, base_t, base_c  # Jacobi: every expert starts from the base
        for pr in PROJS:
            w = {q: es.lat[q].weight() for q in PROJS}
            w[pr] = w[pr].clone().requires_grad_(True)
            c_t = contribution(es, st, None, cfg.emulate, w, steps)
            gout = (cur_t - st.required) * st.weights[:, None] * torch.tensor(2.0, dtype=F32)
            (gw,) = torch.autograd.grad(c_t, [w[pr]], gout)
            groups, pairs = propose(es.lat[pr], gw, cfg)
            stats["proposed"] += len(groups)
            if not len(groups):
                continue
            old_c = contribution(es, sc, None, cfg.emulate, None, steps)
            old_t = c_t.detach()
            lat = es.lat[pr]
            keep = lat.idx.clone()
            flat = lat.idx.view(-1, 2)
            for k in _prefixes(len(groups)):
                flat.copy_(keep.view(-1, 2))
                flat[groups[:k]] = pairs[:k]
                new_t = cur_t - old_t + contribution(es, st, None, cfg.emulate, None, steps)
                new_c = cur_c - old_c + contribution(es, sc, None, cfg.emulate, None, steps)
                nt, nc = obj.sse(new_t, st), obj.sse(new_c, sc)
                if bool(nt < sse_t) and bool(nc <= sse_c * slack):
                    cur_t, cur_c, sse_t, sse_c = new_t, new_c, nt, nc
                    stats["accepted"] += k
                    stats["projections_accepted"] += 1
                    changes.append((lat, keep))
                    break
            else:
                lat.idx.copy_(keep)
    joint_t, joint_c = obj.sse(tuner.coupled("train", train_rows), st), obj.sse(tuner.coupled("train", check_rows), sc)
    # coupled values: the same verdict on every gang member (no change anywhere = no drop = nothing to revert)
    stats["joint_improved"] = bool(joint_t < base_t) and bool(joint_c <= base_c * slack)
    if not stats["joint_improved"]:
        for lat, keep in changes:
            lat.idx.copy_(keep)
    stats.update(train_sse_before=float(base_t), train_sse_after=float(joint_t), check_sse_before=float(base_c),
                 check_sse_after=float(joint_c))
    return stats
