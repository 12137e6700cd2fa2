"""Elastic data-parallel training on Ray Train V2 (`TorchTrainer`): the same Trainer and step on real ranks.

The driver (`python -m app train --workers MIN:MAX ...`) creates the run directory exactly as the one-process
trainer does (config.json, run.json, the init record) plus a checkpoint of step 0, then starts a
`TorchTrainer` with `ScalingConfig(num_workers=(MIN, MAX))` (or a fixed count) and
`FailureConfig(max_failures=...)`. With `--device cuda` each worker gets a GPU (`use_gpu`, `--gpus-per-worker`
of one: 1 by default, with NCCL; a share below 1 lets ranks share a GPU, with gloo on its CUDA tensors) and runs the
step there, its exact accumulators all-reduced on the GPU and rank 0 hashing the state there. The driver makes the
run directory and the checkpoint of step 0 on its CPU (it needs no GPU: the initialization's bits are the same on
every device). Every worker, on every (re)start of the worker group:

- joins the process group Ray Train set up (world R, rank r; gloo, or NCCL) and wraps it (`TorchGroup`);
- loads the latest verified checkpoint of the run directory (training/checkpoint.py) and restores the stream
  state; rank 0 also checks the hash log against it, keeps later records aside and re-checks them as the
  steps recur (Trainer's resume);
- runs each step on topology "RxS" with S = --dp-shard (default 1) and R = world / S (a world that is not a
  multiple of S is refused with a ConfigError): it computes only the microbatches of the windows it owns
  (m mod world == rank, stream.windows_for: any count, none included) into exact int64 gradient accumulators
  (training/step.py). With S = 1 they are summed on the compact exact wire (integer all-reduces,
  collectives/exact_wire.py) and every rank clips and runs AdamW on the full tensors. With S > 1 (HSDP,
  training/sharding.py) they are reduce-scattered within each replica of S ranks to the owners of contiguous
  slices of the flat parameter vector and summed across replicas; each owner clips with the global norm and
  updates its slice of parameters and moments, and the parameters are all-gathered within the replica; rank
  0 gathers the full moments and gradients every step (it hashes and checkpoints them), the other ranks keep
  only their slices. The replica and shard subgroups are torch.distributed.new_group's, made once per worker
  group (`TorchGroup.mesh`). With `exact` reduction and micro_batch = 1 a step's bits depend on neither R nor
  S: the run's chain of state hashes is the one-process run's, and the hash log is byte for byte the
  one-process run's on the virtual topology RxS; the `topology` field of each record says how the step ran.
- rank 0 writes the hash log, metrics and checkpoints, and reports each checkpoint with
  `ray.train.report(metrics, checkpoint=Checkpoint.from_directory(...))`; the other ranks report metrics only
  and do not hash the state.

The run directory must be one the workers all see (a shared filesystem on a multi-node cluster; one local
disk for `ray start --head` on one machine). Any world size runs any step: ranks may own different numbers of
windows, or none. With --dp-shard S, MIN and MAX of --workers must be multiples of S, and an elastic group of
another size fails (counted against --max-failures); HSDP on GPUs needs a GPU per worker. `ordered` reduction
(float32 on the wire, bits that depend on the world size) runs without HSDP and needs the same number of
microbatches on every rank; `exact` takes any split.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")  # Ray Train V2 (elastic ScalingConfig) in ray 2.60

import torch

from training.config import RunConfig, Topology, from_dict
from training.errors import ConfigError
from training.ray_auth import auth_mode, token_auth
from training.rundir import read_jsonl
from training.train import METRICS, TrainOptions, Trainer

auth_mode()  # before anything imports ray, which reads RAY_AUTH_MODE once, as it is imported


class TorchGroup:
    """The data-parallel group training/step.py needs, over the default torch.distributed process group."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._meshes: dict[int, tuple] = {}
        self._collectives = None

    @property
    def collectives(self):
        """collectives.CollectiveGroup over the default group, made at the first reduction (every rank reaches it at
        the same point; by then a GPU worker's device is set, on whichever thread reduces)."""
        if self._collectives is None:
            from collectives import CollectiveGroup

            self._collectives = CollectiveGroup()
            self._collectives.warm_up()
        return self._collectives

    def all_reduce_sum_(self, t: torch.Tensor, width: int | None = None) -> None:
        self.collectives.all_reduce_sum_(t, width)  # int64 (or inf/NaN stand-ins): recursive doubling, order-free anyway

    def all_reduce_max_(self, t: torch.Tensor) -> None:
        self.collectives.all_reduce_max_(t)  # a max is exact in any order

    def all_reduce_ordered_(self, t: torch.Tensor) -> None:
        """float32 sum in the canonical fold's order (collectives' recursive doubling): the `ordered` reduction."""
        from collectives.allreduce import all_reduce_

        all_reduce_(t)

    def all_gather(self, obj) -> list:
        """`obj` (lists, numbers, strings) from every rank, in rank order, sent as JSON bytes in a tensor: nothing is
        unpickled (all_gather_object would unpickle what the other ranks send). Floats survive JSON exactly."""
        dist = self._dist
        dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        mine = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8).to(dev)
        sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([mine.numel()], dtype=torch.int64, device=dev))
        top = max(int(n) for n in sizes)
        bufs = [torch.empty(top, dtype=torch.uint8, device=dev) for _ in range(self.world)]
        dist.all_gather(bufs, torch.cat([mine, torch.zeros(top - mine.numel(), dtype=torch.uint8, device=dev)]))
        return [json.loads(b[:int(n)].cpu().numpy().tobytes()) for b, n in zip(bufs, sizes)]

    def mesh(self, dp_shard: int) -> tuple:
        """(my replica's group, the group of the ranks owning my shard) as CollectiveGroups (training/sharding.py).

        new_group must be called for every subgroup, in one order, on every rank: done once per dp_shard."""
        from collectives import CollectiveGroup

        if dp_shard not in self._meshes:
            reps = self.world // dp_shard
            replica = [self._dist.new_group([r * dp_shard + s for s in range(dp_shard)]) for r in range(reps)]
            shard = [self._dist.new_group([r * dp_shard + s for r in range(reps)]) for s in range(dp_shard)]
            mine = (CollectiveGroup(replica[self.rank // dp_shard]), CollectiveGroup(shard[self.rank % dp_shard]))
            for g in mine:
                g.warm_up()
            self._meshes[dp_shard] = mine
        return self._meshes[dp_shard]


class SoloGroup:
    """One worker without a process group."""

    rank, world = 0, 1

    def all_reduce_sum_(self, t: torch.Tensor, width: int | None = None) -> None:
        pass

    def all_reduce_max_(self, t: torch.Tensor) -> None:
        pass

    def all_reduce_ordered_(self, t: torch.Tensor) -> None:
        pass

    def all_gather(self, obj) -> list:
        return [obj]


class RayTrainer(Trainer):
    """Trainer on one Ray Train worker: checkpoints are also reported to Ray Train (every rank reports)."""

    def checkpoint(self) -> Path | None:
        import ray.train

        path = super().checkpoint()
        metrics = {"step": self.state.step, "world": self.group.world,
                   "chain_hash": self.prev.hex() if self.writer else None}  # only rank 0 hashes the state
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(str(path)) if path else None)
        return path


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how wide a run trains on Ray Train."""
    workers: tuple[int, int]  # (MIN, MAX) workers; MIN == MAX: a fixed group
    address: str | None = None  # Ray cluster address (None: RAY_ADDRESS, else a running local one, else a new one)
    max_failures: int = 3  # worker-group restarts allowed
    dp_shard: int = 1  # HSDP: workers per replica that shard the optimizer state
    gpus_per_worker: float = 1.0  # with --device cuda: a GPU each (NCCL), or a share of one (< 1: gloo)


def torch_backend(device: str, gpus_per_worker: float) -> str:
    """The process group's backend: gloo on CPU; NCCL with a GPU per worker. NCCL refuses two ranks on one GPU,
    while gloo all-reduces CUDA tensors (docs/architecture.md, measured facts): ranks sharing a GPU use gloo."""
    return "nccl" if device.startswith("cuda") and gpus_per_worker >= 1 else "gloo"


def parse_workers(text: str) -> tuple[int, int]:
    """'2' -> (2, 2); '2:4' -> (2, 4)."""
    try:
        lo, _, hi = text.partition(":")
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"--workers: expected N or MIN:MAX, got {text!r}") from None
    if not 1 <= lo_i <= hi_i:
        raise ConfigError(f"--workers: need 1 <= MIN <= MAX, got {text!r}")
    return lo_i, hi_i


def worker_loop(config: dict) -> None:
    """The Ray Train worker function (module doc)."""
    import ray.train
    import torch.distributed as dist

    if config.get("cwd") and os.path.isdir(config["cwd"]):
        os.chdir(config["cwd"])  # relative corpus paths resolve as on the driver
    if config.get("threads"):
        torch.set_num_threads(config["threads"])
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    group = TorchGroup() if dist.is_available() and dist.is_initialized() else SoloGroup()
    if (group.rank, group.world) != (rank, world):
        raise RuntimeError(f"torch.distributed rank/world {group.rank}/{group.world} != Ray Train's {rank}/{world}")
    cfg = from_dict(config["cfg"])
    shard = config.get("dp_shard", 1)
    if world % shard:
        raise ConfigError(f"--dp-shard {shard}: the worker group has {world} workers, not a multiple of it")
    device = "cpu"
    if config.get("device", "cpu").startswith("cuda"):
        import ray.train.torch

        dev = ray.train.torch.get_device()  # the GPU Ray Train assigned this worker (shared ones: the same)
        torch.cuda.set_device(dev)  # where NCCL's and all_gather_object's buffers go
        device = str(dev)
    opts = TrainOptions(config["steps"], config["checkpoint_every"], config["eval_every"],
                        Topology(world // shard, shard), device, progress=False, backend=config.get("backend", "ref"))
    t = RayTrainer(cfg, config["out"], opts, resume=True, group=group, writer=rank == 0)
    t.metrics.append({"event": "workers", "world": world, "from_step": t.state.step,
                      "checkpoint": str(t.resumed_from), "time": time.time()})
    if t.state.step >= opts.steps:
        return
    delay = config.get("step_delay_s")  # tests: slow the steps down so a node can be removed mid-run
    if delay:
        start_step = t.start_step

        def slow_step():
            time.sleep(delay)
            return start_step()

        t.start_step = slow_step
    t.run()


def train_ray(cfg: RunConfig, out: str | Path, opts: TrainOptions, workers: tuple[int, int], resume: bool = False,
              address: str | None = None, max_failures: int = 3, threads: int = 0, resize_interval_s: float = 60.0,
              step_delay_s: float = 0.0, resources_per_worker: dict | None = None, dp_shard: int = 1,
              gpus_per_worker: float = 1.0) -> dict:
    """Train (or resume) the run at `out` on Ray Train workers (HSDP with `dp_shard` > 1: each replica of
    dp_shard workers shards the optimizer state); returns the run's summary ("end" event). With `opts.device`
    cuda each worker takes `gpus_per_worker` of a GPU (module doc)."""
    import ray
    from ray.train import FailureConfig, RunConfig as RayRunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out = Path(out).resolve()
    if opts.topology.world != 1:
        raise ConfigError("--topology: with --workers the topology is the real one, (world / --dp-shard) x --dp-shard")
    if isinstance(dp_shard, bool) or not isinstance(dp_shard, int) or dp_shard < 1:
        raise ConfigError(f"--dp-shard: expected an int >= 1, got {dp_shard!r}")
    if cfg.train.reduction == "ordered" and dp_shard > 1:
        raise ConfigError("--dp-shard: train.reduction='ordered' runs without HSDP on real workers; use 'exact'")
    if workers[0] % dp_shard or workers[1] % dp_shard:
        raise ConfigError(f"--dp-shard {dp_shard}: --workers {workers[0]}:{workers[1]} must be multiples of it")
    gpu = opts.device.startswith("cuda")
    if gpu and not (0 < gpus_per_worker <= 1 or gpus_per_worker == int(gpus_per_worker) > 1):
        raise ConfigError(f"--gpus-per-worker: expected a share of one GPU (0, 1] or a whole number, got "
                          f"{gpus_per_worker}")
    backend = torch_backend(opts.device, gpus_per_worker)
    if gpu and backend == "gloo" and dp_shard > 1:
        raise ConfigError("--dp-shard with workers sharing a GPU: HSDP's collectives need a GPU per worker (NCCL)")
    if not resume:  # the run directory, the init record and a checkpoint of step 0, as the one-process trainer;
        # made on the driver's CPU, which needs no GPU: the initialization's bits are the same on every device
        t = Trainer(cfg, out, replace(opts, device="cpu", backend="ref"))
        t.metrics.append({"event": "ray", "workers": f"{workers[0]}:{workers[1]}", "time": time.time()})
        t.checkpoint()
        t.log.close()
        t.metrics.close()
    if not ray.is_initialized():
        token_auth()
        ray.init(address=address)
    lo, hi = workers
    per_worker = resources_per_worker or ({"CPU": 1, "GPU": gpus_per_worker} if gpu else {"CPU": 1})
    scaling = ScalingConfig(num_workers=lo if lo == hi else (lo, hi), use_gpu=gpu, resources_per_worker=per_worker,
                            **({} if lo == hi else {"elastic_resize_monitor_interval_s": resize_interval_s}))
    loop_cfg = {"cfg": cfg.to_dict(), "out": str(out), "steps": opts.steps, "checkpoint_every": opts.checkpoint_every,
                "eval_every": opts.eval_every, "threads": threads, "cwd": os.getcwd(), "step_delay_s": step_delay_s,
                "dp_shard": dp_shard, "device": opts.device, "backend": opts.backend}
    trainer = TorchTrainer(worker_loop, train_loop_config=loop_cfg, scaling_config=scaling,
                           torch_config=TorchConfig(backend=backend),
                           run_config=RayRunConfig(name=out.name, storage_path=str(out / "ray"),
                                                   failure_config=FailureConfig(max_failures=max_failures)))
    result = trainer.fit()
    if result.error is not None:
        raise result.error
    ends = [r for r in read_jsonl(out / METRICS) if r.get("event") == "end"]
    if not ends:
        raise RuntimeError(f"{out}: the Ray run finished without an end record")
    return ends[-1]


def main(cfg: RunConfig, out: str | Path, opts: TrainOptions, cluster: ClusterOptions, resume: bool = False) -> int:
    """`python -m app train --workers MIN:MAX [--dp-shard S] ...`: train on Ray Train, print the one-line summary."""
    from rich.console import Console

    s = train_ray(cfg, out, opts, cluster.workers, resume, cluster.address, cluster.max_failures, opts.threads,
                  dp_shard=cluster.dp_shard, gpus_per_worker=cluster.gpus_per_worker)
    lo, hi = cluster.workers
    Console(soft_wrap=True).print(
        f"run {s['run']}: {s['steps']} steps on Ray workers {lo}:{hi} (dp_shard {cluster.dp_shard}), "
        f"{s['tokens']:,} tokens, loss {s['first_loss']:.3f} -> {s['last_loss']:.3f}, run hash {s['run_hash']}")
    return 0
