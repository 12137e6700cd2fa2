"""Expert-sharded gangs (the ARVQ write-up, section 5): N Ray actors in one placement group tune one layer together.

Member r owns the cold experts at positions r, r + N, ... of the layer's cold list. Each computes its
experts' routed contributions; quant.expert_sum's exact all-reduce (gloo, collectives.CollectiveGroup)
makes the one coupled output; every member computes the same loss and updates only its experts. Tuned
bits do not depend on N (tests/quant/test_gang.py: N = 1, 2, 4 give one digest).

A member that dies (node loss) fails the layer cleanly: the driver sees the actor error, tears the gang
down (the survivors are blocked in a collective), and raises GangError naming the layer and the member.
Nothing of that layer was published, so a rerun resumes it.
"""
from __future__ import annotations

import os

import torch

from quant.errors import QuantError
from quant.experts import ExpertState
from quant.pv import PVConfig
from training.ray_auth import auth_mode, token_auth

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported


class GangError(QuantError):
    """A gang member failed: names the layer and the member."""


class Member:
    """One gang actor: joins the collective group, then tunes the experts it is handed."""

    def __init__(self) -> None:
        torch.set_num_threads(1)  # bits do not depend on it; shared cores do
        self.group = None

    def endpoint(self) -> tuple[str, int]:
        """(this node's address, a free port): where rank 0 publishes the rendezvous, reachable from any node."""
        import ray

        from collectives import free_port
        return ray.util.get_node_ip_address(), free_port()

    def join(self, rank: int, world: int, addr: str, port: int, timeout_s: float) -> int:
        from collectives import CollectiveGroup
        self.group = CollectiveGroup.init(rank, world, master_addr=addr, master_port=port, timeout_s=timeout_s)
        return os.getpid()

    def tune(self, problem, states: list[ExpertState], cfg: PVConfig, crash_at: int | None) -> tuple[list, dict]:
        from quant.expert_sum import Reducer
        from quant.pv import Tuner
        result = Tuner(problem, states, Reducer(self.group.group, distributed=True), cfg, crash_at=crash_at).run()
        return states, result

    def leave(self) -> None:
        if self.group is not None:
            self.group.destroy()
            self.group = None


class Gang:
    """N members in a PACK placement group of one CPU bundle each, joined into one gloo group."""

    def __init__(self, n: int, timeout_s: float = 120.0) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        if n < 1:
            raise GangError(f"--gang must be >= 1, got {n}")
        if not ray.is_initialized():
            token_auth()
            ray.init(address="local", num_cpus=max(n, os.cpu_count() or 1), include_dashboard=False,
                     log_to_driver=False)  # a new instance, never a cluster some other process left behind
        self.n, self.timeout_s, self.ray = n, timeout_s, ray
        self.pg = placement_group([{"CPU": 1}] * n, strategy="PACK")
        ray.get(self.pg.ready(), timeout=timeout_s)
        remote = ray.remote(num_cpus=1, max_restarts=0)(Member)
        self.actors = [remote.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=i)).remote() for i in range(n)]
        # rank 0's node address, not 127.0.0.1: the placement group may put members on other nodes
        addr, port = ray.get(self.actors[0].endpoint.remote(), timeout=timeout_s)
        self.pids = ray.get([a.join.remote(i, n, addr, port, timeout_s) for i, a in enumerate(self.actors)],
                            timeout=timeout_s)

    def tune(self, problem, states: list[ExpertState], cfg: PVConfig,
             crash: tuple[int, int] | None = None) -> tuple[list[ExpertState], dict]:
        """Tune the layer on the gang; (states in the given order, rank 0's result with merged reassign counts)."""
        owned = [[s for i, s in enumerate(states) if i % self.n == r] for r in range(self.n)]
        futs = [a.tune.remote(problem, owned[r], cfg, crash[1] if crash and crash[0] == r else None)
                for r, a in enumerate(self.actors)]
        pending, done = list(futs), {}
        while pending:
            ready, pending = self.ray.wait(pending, num_returns=1, timeout=None)
            for ref in ready:
                rank = futs.index(ref)
                try:
                    done[rank] = self.ray.get(ref)
                except Exception as exc:  # an actor died or raised: the layer fails, the gang goes
                    self.close()
                    raise GangError(f"layer {problem.layer}: gang member {rank} of {self.n} failed "
                                    f"({type(exc).__name__}); nothing of this layer was published, "
                                    f"rerun to resume it") from None
        by_expert = {s.expert: s for r in range(self.n) for s in done[r][0]}
        result = dict(done[0][1])
        result["reassign"] = [_merge([done[r][1]["reassign"][i] for r in range(self.n)])
                              for i in range(len(result["reassign"]))]
        return [by_expert[s.expert] for s in states], result

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group
        for a in getattr(self, "actors", []):
            try:
                self.ray.kill(a, no_restart=True)
            except Exception:  # already dead: nothing to kill
                pass
        self.actors = []
        if getattr(self, "pg", None) is not None:
            remove_placement_group(self.pg)
            self.pg = None


def _merge(parts: list[dict]) -> dict:
    out = dict(parts[0])
    for k in ("proposed", "accepted", "projections_accepted"):
        out[k] = sum(p[k] for p in parts)
    return out
