"""Index reassignment proposals and prefixes; the coverage gate freezes experts with too few rows."""
from dataclasses import replace

import torch

from quant import layer as L
from quant.fit import FitConfig
from quant.pv import PVConfig
from quant.reassign import _prefixes, propose
from quant.student import Latent

from .test_pipeline import _problem


def test_prefixes_are_all_quarter_sixteenth_one():
    assert _prefixes(100) == [100, 25, 7, 1]
    assert _prefixes(3) == [3, 1] and _prefixes(1) == [1]


def test_proposals_are_changes_with_positive_first_order_gain(make_projection):
    p = make_projection(2, e=1, n=16, k=128)
    lat = Latent.from_projection(p, 0)
    gw = torch.randn(16, 128, generator=torch.Generator().manual_seed(3))
    cfg = replace(PVConfig(), max_fraction=0.01, target_ratio=0.5)
    groups, pairs = propose(lat, gw, cfg)
    assert 0 < len(groups) <= max(1, int(0.01 * 16 * 16))
    atoms = lat.atoms()
    idx = lat.idx.reshape(-1, 2)
    g = gw.reshape(16, 16, 8).reshape(-1, 8)
    for grp, (a, b) in zip(groups.tolist(), pairs.tolist()):
        assert (a, b) != tuple(idx[grp].tolist())
        dv = atoms[0][a] + atoms[1][b] - atoms[0][idx[grp, 0]] - atoms[1][idx[grp, 1]]
        assert float(-(g[grp] * dv).sum()) > 0


def test_coverage_gate_freezes_experts(tiny_donor, tiny_data):
    p = _problem(tiny_donor, tiny_data)
    projs, _ = L.initial_fit(tiny_donor, p, FitConfig(sample_groups=1000))
    st = L.states_from(projs, p.cold)
    res = L.tune_local(p, st, PVConfig(updates=2, microbatches=1, micro_rows=256, reassign_every=1,
                                       min_rows=10 ** 9))
    for s, e in zip(st, p.cold):
        for proj in ("w13", "w2"):
            ref = Latent.from_projection(projs[proj], p.cold.index(e))
            assert torch.equal(s.lat[proj].books, ref.books) and torch.equal(s.lat[proj].idx, ref.idx)
    assert all(r["proposed"] == 0 for r in res["reassign"])
