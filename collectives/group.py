"""A collective group over torch.distributed point-to-point, for Ray Train workers and Ray actor gangs alike.

Gloo on CPU, NCCL on GPU. By default every reduction is deterministic (TreeFold's bits on every rank);
`native=True` swaps in torch's own all-reduce for speed comparisons and marks the group
`deterministic=False`, which a run's log must record (such a run is not auditable).
"""
from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist

from .allreduce import all_reduce_ as _det_all_reduce_
from .average import average_ as _average_
from .p2p import exchange
from .reduce_scatter import all_gather as _all_gather
from .reduce_scatter import gather as _gather
from .reduce_scatter import reduce_scatter as _det_reduce_scatter
from .reduce_scatter import split_bounds


def free_port() -> int:
    """A TCP port free on this host right now (for rank 0 to publish as the rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class CollectiveGroup:
    """Deterministic collectives over a process group (the default one unless `group` is given).

    Wrapping a group made elsewhere (e.g. by Ray Train): call `warm_up()` once on every rank before the
    first collective, and prefer groups initialized with device_id on NCCL (docs/architecture.md, measured facts).
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, native: bool = False, chunks: int = 1,
                 device: torch.device | None = None, _owns_default: bool = False) -> None:
        if not dist.is_initialized():
            raise RuntimeError("CollectiveGroup needs an initialized torch.distributed; use CollectiveGroup.init(...)")
        self.group = group
        self.native = native
        self.chunks = chunks  # pipelining of the deterministic all-reduce; never changes its bits
        self._scratch: dict[tuple, list[torch.Tensor]] = {}  # receive buffers kept (first touch is slow)
        self.backend = str(dist.get_backend(group))
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        self.device = device
        self._owns_default = _owns_default

    @classmethod
    def init(cls, rank: int, world: int, *, master_addr: str | None = None, master_port: int | None = None,
             init_method: str | None = None, store: dist.Store | None = None, backend: str | None = None,
             device: torch.device | str | None = None, native: bool = False, chunks: int = 1,
             timeout_s: float = 600.0) -> "CollectiveGroup":
        """Create this process's default process group (rendezvous by addr/port, init_method or store) and wrap it."""
        if dist.is_initialized():
            raise RuntimeError("torch.distributed is already initialized here; wrap it with CollectiveGroup(...)")
        if not 0 <= rank < world:
            raise ValueError(f"rank must be in [0, {world}), got {rank}")
        dev = torch.device(device) if device is not None else torch.device("cpu")
        backend = backend or ("nccl" if dev.type == "cuda" else "gloo")
        if store is None and init_method is None:
            if master_addr is None or master_port is None:
                raise ValueError("give master_addr and master_port, an init_method, or a store")
            init_method = f"tcp://{master_addr}:{master_port}"
        kw: dict = {"backend": backend, "rank": rank, "world_size": world,
                    "timeout": datetime.timedelta(seconds=timeout_s)}
        if store is not None:
            kw["store"] = store
        else:
            kw["init_method"] = init_method
        if backend == "nccl":
            if dev.type != "cuda":
                raise ValueError(f"the nccl backend needs a cuda device, got {dev}")
            dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
            torch.cuda.set_device(dev)
            kw["device_id"] = dev  # eager NCCL init; point-to-point needs it (docs/architecture.md, measured facts)
        dist.init_process_group(**kw)
        g = cls(None, native=native, chunks=chunks, device=dev, _owns_default=True)
        g.warm_up()
        return g

    @property
    def deterministic(self) -> bool:
        """False when torch's native (order-unspecified) reductions are in use: record it in the run log."""
        return not self.native

    def describe(self) -> dict:
        """What a run log records about the reductions."""
        return {"backend": self.backend, "world": self.world, "deterministic": self.deterministic,
                "all_reduce": "torch-native" if self.native else "recursive-doubling (TreeFold order)",
                "reduce_scatter": "torch-native" if self.native else "all-to-all + ascending-rank sum"}

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum over the group; deterministic mode gives TreeFold's bits on every rank."""
        if self.native:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
            return tensor
        return _det_all_reduce_(tensor, self.group, self.chunks, self._pool(tensor))

    def _pool(self, tensor: torch.Tensor, width: int | None = None) -> list[torch.Tensor]:
        # one pool a dtype and device (the exact wire mixes uint8, int64 and float64); packed words travel as bytes
        dtype = torch.uint8 if width is not None and width != tensor.element_size() else tensor.dtype
        return self._scratch.setdefault((dtype, tensor.device), [])

    def average_(self, tensor: torch.Tensor, n: int | None = None) -> torch.Tensor:
        """tensor *= 1/n (default n = world) as a reciprocal multiply."""
        return _average_(tensor, self.world if n is None else n)

    def reduce_scatter(self, tensor: torch.Tensor, sizes: list[int] | None = None) -> torch.Tensor:
        """This rank's shard of the sum of `tensor` over the group (1-D): `shard_bounds`'s, or of the given `sizes`."""
        if self.native:
            full = tensor.detach().reshape(-1).clone()
            dist.all_reduce(full, op=dist.ReduceOp.SUM, group=self.group)  # gloo has no reduce_scatter
            a, b = split_bounds(full.numel(), self.world, sizes)[self.rank]
            return full[a:b].clone()
        return _det_reduce_scatter(tensor, self.group, sizes)

    def all_gather(self, shard: torch.Tensor, numel: int) -> torch.Tensor:
        """The full 1-D buffer of `numel` elements from every rank's shard (data movement only)."""
        return _all_gather(shard, numel, self.group)

    def gather(self, shard: torch.Tensor, numel: int, dst: int = 0) -> torch.Tensor | None:
        """On group rank `dst` the full 1-D buffer of `numel` elements from every rank's shard; None elsewhere."""
        return _gather(shard, numel, self.group, dst)

    def all_reduce_sum_(self, tensor: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """In-place sum for the compact exact wire's integers (and its non-finite stand-ins): the recursive-doubling
        schedule, as `all_reduce_` (integer sums are exact in any order anyway); torch's own in native mode.
        width: int64 values travel as their low `width` bytes (every value and partial sum must fit them);
        native mode sends all 8."""
        if self.native:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
            return tensor
        return self._scheduled(tensor, "sum", width)

    def all_reduce_max_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place elementwise max over the group on the recursive-doubling schedule (torch's own in native mode)."""
        if self.native:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.group)
            return tensor
        return self._scheduled(tensor, "max")

    def _scheduled(self, tensor: torch.Tensor, op: str, width: int | None = None) -> torch.Tensor:
        """The recursive-doubling schedule in place; under gloo a GPU tensor goes through a host copy (gloo's point
        to point moves host memory only; its all-reduce takes GPU tensors, which Ray GPU workers sharing a GPU use)."""
        if self.backend == "gloo" and tensor.device.type != "cpu":
            host = tensor.cpu()
            _det_all_reduce_(host, self.group, self.chunks, self._pool(host, width), op=op, width=width)
            return tensor.copy_(host)
        return _det_all_reduce_(tensor, self.group, self.chunks, self._pool(tensor, width), op=op, width=width)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Overwrite `tensor` with rank `src`'s (group rank) in place (data movement only)."""
        gsrc = src if self.group is None else dist.get_global_rank(self.group, src)
        dist.broadcast(tensor, src=gsrc, group=self.group)
        return tensor

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            dist.barrier(group=self.group)

    def release_scratch(self) -> None:
        """Drop the cached receive buffers."""
        self._scratch = {}

    def destroy(self) -> None:
        """Tear down the process group if this object created it."""
        self._scratch = {}
        if self._owns_default and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_default = False

    def warm_up(self) -> None:
        """A one-element ring exchange on every rank (collective: all ranks call it)."""
        # NCCL wants the first batched point-to-point of a group to involve every rank
        if self.world == 1:
            return
        x = torch.zeros(1, device=self.device)
        y = torch.empty_like(x)
        exchange([(x, (self.rank + 1) % self.world)], [(y, (self.rank - 1) % self.world)], self.group)
