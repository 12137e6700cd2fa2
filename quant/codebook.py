"""Codebook EM for the two additive 256 x 8 books on the FP4 grid (the ARVQ write-up, section 3).

Data: normalized 8-dim groups v (weights divided by their block scale), drawn with probability
proportional to their Hessian importance, with optional per-dimension weights d (the Hessian metric's
diagonal inside a group). Objective: sum_i sum_j d_ij (v_ij - c0[a_i]_j - c1[b_i]_j)^2.

Warm start: k-means for c0 on v, then k-means for c1 on the residuals v - c0[a]. Then `iters`
alternating refinements: (a, b) by the beam search below, c0 given b, c1 given a. All of it is
unconstrained; the atoms go to FP4 only at the end, in stages (`round_in_stages`): given the assignment
the objective is separable per (atom, dim) and quadratic, so rounding the weighted mean is the exact
constrained M-step, but doing it every step stalls Lloyd, whose moves are then smaller than the grid's
spacing and round back. On GPUs the sums over samples are one-hot matmuls, not index_add (CUDA's
atomics would make them order-dependent).

Assignment: the ARVQ write-up's alternating search (greedy c0 then c1, then refinements), or a beam over
c0 (`beam` nearest c0 atoms, each with its best c1 atom). With these books the whole fit of i.i.d. Gaussian
1024 x 1024 weights, H = I (FitConfig's defaults but the beam, in EM and sweep) reaches relative L2 error
0.3002 at width 8, 0.2983 at 16, 0.2977 at 32; at 32 in the sweep only, 0.2987.
"""
from __future__ import annotations

import torch

from quant.format import ATOMS
from quant.fp_formats import fp4_round

# fractions of the two books' entries on the FP4 grid after each rounding stage (ours: Gaussian 1024 x 1024,
# H = I, 65,536 groups: 0.3017 against 0.3019 for c0 rounded at once, c1 refit twice and rounded)
ROUND_STAGES = (0.5, 0.75, 0.875, 1.0)


def nearest(t: torch.Tensor, books: torch.Tensor, d: torch.Tensor | None = None,
            norm: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [M]: argmin_k sum_j d_j (t_j - books[k, j])^2 (plain L2 when d is None; `norm` = the books'
    squared norms, if the caller has them)."""
    if d is None:
        norm = (books * books).sum(1) if norm is None else norm
        return torch.argmin(torch.addmm(norm, t, books.T, alpha=-2.0), dim=1)
    return torch.argmin(d @ (books * books).T - 2.0 * ((d * t) @ books.T), dim=1)


def _beam(v: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, d: torch.Tensor | None, width: int,
          norms: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Best (a, b) among the `width` atoms of c0 nearest to v, each with its best c1 atom for the residual."""
    m = v.shape[0]
    if d is None:
        d0 = torch.addmm(norms[0], v, c0.T, alpha=-2.0)                     # [M, 256], up to a row constant
        ca = torch.topk(d0, width, dim=1, largest=False).indices            # [M, B]
        r = (v.unsqueeze(1) - c0[ca]).reshape(-1, v.shape[1])              # [M*B, 8] residuals
        best, bi = torch.addmm(norms[1], r, c1.T, alpha=-2.0).min(dim=1)
        best = (best + (r * r).sum(1)).reshape(m, width)                    # full residual errors
    else:
        d0 = d @ (c0 * c0).T - 2.0 * ((d * v) @ c0.T)
        ca = torch.topk(d0, width, dim=1, largest=False).indices
        r = v.unsqueeze(1) - c0[ca]                                         # [M, B, 8]
        dr = d.unsqueeze(1) * r
        dist = (dr * r).sum(-1, keepdim=True) - 2.0 * (dr @ c1.T) + (d @ (c1 * c1).T).unsqueeze(1)
        best, bi = dist.min(dim=2)
    bi = bi.reshape(m, width)
    j = best.argmin(dim=1, keepdim=True)
    return ca.gather(1, j).squeeze(1), bi.gather(1, j).squeeze(1)


def assign_pair(v: torch.Tensor, c0: torch.Tensor, c1: torch.Tensor, d: torch.Tensor | None = None,
                rounds: int = 1, a: torch.Tensor | None = None, b: torch.Tensor | None = None,
                beam: int = 0, chunk: int | None = None,
                norms: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) for groups v [M, 8]: beam search over c0 (beam > 0) or greedy c0-then-c1 (unless a, b are
    given), then `rounds` alternating refinements (each can only lower the error). Chunks of 512 rows keep
    the [rows, beam, 256] distances in cache on CPU (2.6x faster than 4096 rows at once on one core); a GPU
    takes larger chunks (fewer launches; 32,768 rows x beam 8 x 256 fp32 distances are 268 MB). `norms`: the books' squared norms, if the caller has them."""
    chunk = chunk or (512 if v.device.type == "cpu" else 32768)
    if norms is None and d is None:
        norms = ((c0 * c0).sum(1), (c1 * c1).sum(1))
    n0, n1 = (None, None) if d is not None else norms
    if beam > 0:
        parts = [_beam(v[i:i + chunk], c0, c1, None if d is None else d[i:i + chunk], min(beam, ATOMS), norms)
                 for i in range(0, v.shape[0], chunk)]
        a, b = ((parts[0][0], parts[0][1]) if len(parts) == 1
                else (torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])))
    elif a is None or b is None:
        a = nearest(v, c0, d, n0)
        b = nearest(v - c0[a], c1, d, n1)
    for _ in range(rounds):
        a = nearest(v - c1[b], c0, d, n0)
        b = nearest(v - c0[a], c1, d, n1)
    return a, b


def weighted_error(t: torch.Tensor, q: torch.Tensor, d: torch.Tensor | None) -> torch.Tensor:
    """Per-sample sum_j d_j (t_j - q_j)^2."""
    e = (t - q) ** 2
    return (e if d is None else e * d).sum(dim=1)


def m_step(target: torch.Tensor, assign: torch.Tensor, d: torch.Tensor | None, old: torch.Tensor,
           err: torch.Tensor, project: bool = True) -> torch.Tensor:
    """Weighted means of `target` per atom (FP4-projected if `project`); empty atoms reseeded at the
    worst-fit samples."""
    if target.device.type == "cpu":  # CPU index_add_ adds in index order: deterministic, and 10x a one-hot matmul
        count = torch.bincount(assign, minlength=ATOMS)
        num = torch.zeros_like(old).index_add_(0, assign, target if d is None else d * target)
        den = (count.to(old.dtype).unsqueeze(1).expand_as(old) if d is None
               else torch.zeros_like(old).index_add_(0, assign, d))
    else:
        onehot = torch.zeros(len(assign), ATOMS, dtype=target.dtype, device=target.device)
        onehot.scatter_(1, assign.unsqueeze(1), 1.0)                     # [M, 256], no int64 one_hot
        count = onehot.sum(0)                                            # CUDA bincount reads its max back
        num = onehot.T @ (target if d is None else d * target)           # [256, 8]
        den = count.to(old.dtype).unsqueeze(1).expand_as(old) if d is None else onehot.T @ d
    c = torch.where(den > 0, num / den.clamp(min=torch.finfo(den.dtype).tiny), old)
    # empty atoms take the worst-fit samples in order, without reading the count back (no host sync)
    empty = count == 0
    worst = torch.topk(err, min(ATOMS, len(err))).indices
    order = torch.cumsum(empty.long(), 0)                                # 1-based rank among the empty atoms
    rank = (order - 1).clamp(min=0, max=len(worst) - 1)
    fill = empty & (order <= len(worst))
    c = torch.where(fill.unsqueeze(1), target[worst[rank]], c)
    return fp4_round(c) if project else c


def kmeans(v: torch.Tensor, d: torch.Tensor | None, iters: int, gen: torch.Generator) -> torch.Tensor:
    """ATOMS unconstrained centroids of v: seeded distinct-sample init, `iters` Lloyd steps."""
    init = torch.randperm(v.shape[0], generator=gen)[:ATOMS].to(v.device)
    c = v[init] if len(init) == ATOMS else v[init.repeat(ATOMS // len(init) + 1)[:ATOMS]]
    for _ in range(iters):
        a = nearest(v, c, d)
        c = m_step(v, a, d, c, weighted_error(v, c[a], d), project=False)
    return c


def grid_distance(c: torch.Tensor) -> torch.Tensor:
    """|c - fp4_round(c)| in units of the FP4 spacing at |c| (0.5 below 2, 1 in [2, 4), 2 above): in [0, 0.5]
    inside the grid's range."""
    spacing = torch.where(c.abs() < 2.0, 0.5, torch.where(c.abs() < 4.0, 1.0, 2.0))
    return (c - fp4_round(c)).abs() / spacing


def freeze_nearest(books: torch.Tensor, frozen: torch.Tensor, frac: float) -> torch.Tensor:
    """`frozen` grown to the fraction `frac` of all entries, adding the free entries nearest the grid."""
    key = torch.where(frozen, -1.0, grid_distance(books)).flatten()     # frozen ones sort first
    order = torch.sort(key, stable=True).indices                         # stable: ties in index order
    keep = torch.zeros_like(key, dtype=torch.bool)
    keep[order[:round(frac * key.numel())]] = True
    return keep.reshape(books.shape) | frozen


def round_in_stages(v: torch.Tensor, d: torch.Tensor | None, c0: torch.Tensor, c1: torch.Tensor,
                    a: torch.Tensor, b: torch.Tensor, *, steps: int, beam: int, rounds: int,
                    stages: tuple[float, ...] = ROUND_STAGES) -> tuple[torch.Tensor, torch.Tensor]:
    """Float books to the FP4 grid in stages: each stage rounds the free entries nearest the grid until the
    stage's fraction of both books is on it, then `steps` EM steps move only the free entries (the exact
    M-step per entry given the other book), so they absorb what the rounded ones lost. The last stage
    rounds the rest."""
    if not stages or stages[-1] != 1.0:
        raise ValueError(f"codebook.round_in_stages: the last stage must be 1.0 (every entry), got {stages}")
    books = torch.stack([c0, c1])
    frozen = torch.zeros_like(books, dtype=torch.bool)
    for frac in stages:
        frozen = freeze_nearest(books, frozen, frac)
        books = torch.where(frozen, fp4_round(books), books)
        c0, c1 = books[0], books[1]
        for _ in range(steps if frac < 1.0 else 0):
            a, b = assign_pair(v, c0, c1, d, rounds, a, b, beam=beam)
            err = weighted_error(v, c0[a] + c1[b], d)
            c0 = torch.where(frozen[0], c0, m_step(v - c1[b], a, d, c0, err, project=False))
            c1 = torch.where(frozen[1], c1, m_step(v - c0[a], b, d, c1, err, project=False))
        books = torch.stack([c0, c1])
    return books[0], books[1]


def fit_codebooks(v: torch.Tensor, d: torch.Tensor | None, *, kmeans_iters: int = 10, iters: int = 8,
                  rounds: int = 1, beam: int = 0, polish: int = 2,
                  seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(c0, c1, weighted-MSE history as 0-dim tensors) for normalized groups v [M, 8] and dim weights d.

    The EM runs unconstrained and the books go to the FP4 grid at the end: projecting every M-step
    stalls Lloyd, whose moves are smaller than the grid's spacing and round back (Gaussian, H = I:
    0.310 against 0.303 for the same sample). Then `round_in_stages` with `polish` EM steps a stage."""
    gen = torch.Generator().manual_seed(seed)
    c0 = kmeans(v, d, kmeans_iters, gen)
    a = nearest(v, c0, d)
    c1 = kmeans(v - c0[a], d, kmeans_iters, gen)
    b = nearest(v - c0[a], c1, d)
    history = []
    for _ in range(iters):
        a, b = assign_pair(v, c0, c1, d, rounds, a, b, beam=beam)
        err = weighted_error(v, c0[a] + c1[b], d)  # reseeding needs only a rough worst-fit ranking
        c0 = m_step(v - c1[b], a, d, c0, err, project=False)
        c1 = m_step(v - c0[a], b, d, c1, err, project=False)
        history.append(err.mean())
    c0, c1 = round_in_stages(v, d, c0, c1, a, b, steps=polish, beam=beam, rounds=rounds)
    return c0, c1, history


def importance_sample(importance: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """`count` distinct indices drawn with probability proportional to importance (Efraimidis-Spirakis)."""
    n = importance.numel()
    if count >= n:
        return torch.arange(n, device=importance.device)
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64).to(importance.device).clamp(min=1e-300)
    keys = torch.log(u) / importance.double().clamp(min=1e-300)  # larger key = drawn earlier
    return torch.sort(torch.topk(keys, count).indices).values
