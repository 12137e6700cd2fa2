"""Self-check of a live CollectiveGroup: every collective against its single-process reference, bit for bit.

Every rank builds all ranks' inputs from a seed (integer bit patterns, no float RNG: the same on any
machine), runs the collectives, and compares its own outputs with TreeFold / the simulations.
`run_local` starts R local processes (gloo, or NCCL with one GPU each) and gathers their verdicts.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.multiprocessing as mp

from .allreduce import all_reduce_ as _det_all_reduce_
from .average import reciprocal
from .exact import exact_all_reduce_, exact_sum
from .group import CollectiveGroup, free_port
from .reduce_scatter import shard_bounds, simulate_reduce_scatter
from .treefold import treefold


def make_inputs(world: int, n: int, seed: int = 0) -> list[torch.Tensor]:
    """`world` float32 buffers of n elements: Philox integers -> mantissa and exponent, assembled exactly."""
    rng = np.random.Generator(np.random.Philox(seed))
    out = []
    for _ in range(world):
        mant = rng.integers(-(1 << 23), 1 << 23, n).astype(np.float64)
        exp = rng.integers(-35, -11, n)  # values ~2^-12..2^12: wide enough that the sum order shows in the bits
        out.append(torch.from_numpy(np.ldexp(mant, exp).astype(np.float32)))  # exact: 24-bit mantissas
    return out


def digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's raw bytes (on the host)."""
    return hashlib.sha256(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


def check(g: CollectiveGroup, n: int = 4097, seed: int = 0) -> dict:
    """Run every collective of `g` on seeded inputs; {op: same bits as the reference} plus digests."""
    world, rank, dev = g.world, g.rank, g.device
    ps = make_inputs(world, n, seed)
    ref = treefold(ps)
    mine = ps[rank].to(dev)
    res: dict[str, bool] = {}
    out = g.all_reduce_(mine.clone())
    res["all_reduce"] = _same(out, ref)
    res["all_reduce_chunked"] = _same(_det_all_reduce_(mine.clone(), g.group, chunks=3), ref)
    two_d = g.all_reduce_(mine[: (n // 3) * 3].clone().reshape(3, -1))
    res["all_reduce_2d"] = _same(two_d, treefold([p[: (n // 3) * 3].reshape(3, -1) for p in ps]))
    res["average"] = _same(g.average_(out.clone()), ref * reciprocal(world))
    shard = g.reduce_scatter(mine)
    res["reduce_scatter"] = _same(shard, simulate_reduce_scatter(ps)[rank])
    sizes = [n - (world - 2)] + [1] * (world - 2) + [0] if world > 1 else [n]  # uneven, the last one empty
    res["reduce_scatter_sizes"] = _same(g.reduce_scatter(mine, sizes), simulate_reduce_scatter(ps, sizes)[rank])
    res["all_gather"] = _same(g.all_gather(shard, n), torch.cat(simulate_reduce_scatter(ps)))
    got = g.gather(shard, n, dst=world - 1)
    res["gather"] = _same(got, torch.cat(simulate_reduce_scatter(ps))) if rank == world - 1 else got is None
    res["all_reduce_max"] = _same(g.all_reduce_max_(mine.clone()), torch.stack(ps).amax(0))
    res["broadcast"] = _same(g.broadcast(mine.clone(), src=world - 1), ps[world - 1])
    res["exact_all_reduce"] = _same(exact_all_reduce_(mine.clone(), g.group, block=256), exact_sum(ps, block=256))
    ints = [p.view(torch.int32).to(torch.int64) << 21 for p in ps]  # |x| <= 2^52: sums of up to 8 fit 7 bytes
    packed = g.all_reduce_sum_(ints[rank].to(dev).clone(), width=7)
    res["all_reduce_sum_7_bytes"] = _same(packed, torch.stack(ints).sum(0))
    # torch's own all-reduce on the same group: marked non-deterministic; close, bits unspecified
    native = CollectiveGroup(g.group, native=True, device=dev)
    nat = native.all_reduce_(mine.clone()).cpu().double()
    exact = torch.stack([p.double() for p in ps]).sum(0)  # float64 sum of float32 addends: a tolerance reference
    nat_rs = native.reduce_scatter(mine).cpu().double()
    a, b = shard_bounds(n, world)[rank]
    g.barrier()
    return {"rank": rank, "world": world, "backend": g.backend, "deterministic": g.deterministic,
            "ok": res, "all_reduce_digest": digest(out), "treefold_digest": digest(ref),
            "native": {"deterministic": native.deterministic,
                       "close": bool(torch.allclose(nat, exact, rtol=1e-5, atol=1e-4)
                                     and torch.allclose(nat_rs, exact[a:b], rtol=1e-5, atol=1e-4)),
                       "bits_match_treefold": _same(nat.float(), ref)}}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def _worker(rank: int, world: int, port: int, backend: str, n: int, seed: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    g = CollectiveGroup.init(rank, world, master_addr="127.0.0.1", master_port=port, backend=backend,
                             device=dev, timeout_s=300)
    try:
        result = check(g, n, seed)
    finally:
        g.destroy()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def run_local(worlds: tuple[int, ...] = (2,), backend: str = "gloo", n: int = 4097, seed: int = 0,
              start_method: str = "forkserver") -> dict[int, list[dict]]:
    """Run `check` on local process groups of each size in `worlds` at once; {world: per-rank results}.

    The default forkserver imports torch once and forks the ranks from it (seconds, where spawn re-imports
    torch in every rank); the caller's __main__ must be import-safe, as for spawn.
    """
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # localhost rendezvous, whatever the host's interfaces
    if start_method == "forkserver":
        mp.get_context("forkserver").set_forkserver_preload([__name__])
    with tempfile.TemporaryDirectory(prefix="collectives-selftest-") as tmp:
        ctxs = {}
        for w in worlds:
            d = Path(tmp, f"w{w}")
            d.mkdir()
            ctxs[w] = mp.start_processes(_worker, args=(w, free_port(), backend, n, seed, str(d)), nprocs=w,
                                         join=False, start_method=start_method)
        for c in ctxs.values():
            while not c.join():
                pass
        return {w: [json.loads(Path(tmp, f"w{w}", f"rank{r}.json").read_text()) for r in range(w)] for w in worlds}


class GangMember:
    """The body of a Ray actor (wrap with `ray.remote`) that joins a collective group and self-checks it."""

    def __init__(self) -> None:
        self.group: CollectiveGroup | None = None

    def port(self) -> int:
        """A free port on this actor's host (ask rank 0's actor, then pass it to every join)."""
        return free_port()

    def join(self, rank: int, world: int, master_addr: str, master_port: int, backend: str = "gloo") -> dict:
        if master_addr in ("127.0.0.1", "localhost"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dev = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")  # Ray gives one visible GPU
        self.group = CollectiveGroup.init(rank, world, master_addr=master_addr, master_port=master_port,
                                          backend=backend, device=dev, timeout_s=120)
        return self.group.describe()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        assert self.group is not None
        return self.group.all_reduce_(t.to(self.group.device).clone()).cpu()

    def check(self, n: int = 4097, seed: int = 0) -> dict:
        assert self.group is not None
        return check(self.group, n, seed)

    def leave(self) -> None:
        if self.group is not None:
            self.group.destroy()
            self.group = None
