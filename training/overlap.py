"""The cross-rank gradient reduction of a real group, bucket by bucket, overlapped with the last local backward.

A rank's windows' gradients stream into per-tensor ExactSums (training/reduction.py). Before the last microbatch's
backward runs, a tensor hook on each of its per-window leaves (training/windows.py) adds that leaf's gradient to its
sum the moment autograd produces it (hooks fire under torch.autograd.grad too); a tensor is complete once every
window's gradient of it is in. The tensors are cut into buckets in the order the backward produces them (the
reverse of the parameters' order in the model spec, the same on every rank); once all of a bucket's tensors are in,
the bucket goes to one communication thread, which reduces the buckets across ranks strictly in bucket order (so
every rank issues the same collectives in the same order, also a rank with no microbatch, which only adds zeros),
while the backward goes on producing the next buckets.

The bits are the unbucketed reduction's: every partial enters its ExactSum once, integer sums
are order-free, and both the compact wire and the reduce-scatter give each element a function of its own integers
only, whatever else shares the exchange. Gradients the backward never produces (unused leaves) enter as zeros when
it ends, as they did before.

`observer(event, bucket)`, when given, is called at each point of the timeline (`EVENTS`), from the thread where
it happens; profiles and the tests read the order of events, never their times.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from training.errors import ConfigError

# the last microbatch asked for (its forward starts), a leaf's gradient added (bucket: its bucket), a bucket complete
# and handed to the communication thread, its reduction started and finished there; and from training/step.py, a
# microbatch's torch.autograd.grad returned ("backward_end", the rank's microbatch index)
EVENTS = ("last_microbatch", "gradient", "ready", "start", "done", "backward_end")
BUCKET_ELEMENTS = 1 << 21  # ~8 MB of float32 gradient a bucket: DDP's 25 MB order, many buckets at 1B parameters


def bucket_plan(numel: dict[str, int], order: Iterable[str], elements: int = BUCKET_ELEMENTS) -> list[tuple[str, ...]]:
    """Buckets of whole tensors in `order` (the backward's), each closed once it holds `elements` or more."""
    if elements < 1:
        raise ConfigError(f"bucket_elements must be >= 1, got {elements}")
    buckets, cur, size = [], [], 0
    for k in order:
        cur.append(k)
        size += numel[k]
        if size >= elements:
            buckets.append(tuple(cur))
            cur, size = [], 0
    if cur:
        buckets.append(tuple(cur))
    return buckets


class Overlapped:
    """One step's bucketed reduction (module doc): `run(parts)` returns each bucket's `reduce_bucket(names)` result
    in bucket order.

    `numel`: elements per tensor name; `windows`: this rank's partials (one per window); `last`: the coords of the
    last microbatch's windows, whose gradients the hooks take; `add(name, grad)`: puts a partial into the sums;
    `reduce_bucket(names)`: the cross-rank reduction of those tensors' sums (runs on the communication thread)."""

    def __init__(self, numel: dict[str, int], buckets: list[tuple[str, ...]], windows: int, last: list,
                 add: Callable[[str, torch.Tensor], None], reduce_bucket: Callable[[tuple[str, ...]], object],
                 observer: Callable[[str, int], None] | None = None) -> None:
        self.buckets, self.windows, self.last = buckets, windows, list(last)
        self.add, self.reduce_bucket = add, reduce_bucket
        self.observe = observer or (lambda event, bucket: None)
        self.bucket_of = {k: i for i, names in enumerate(buckets) for k in names}
        missing = set(numel) ^ set(self.bucket_of)
        if missing:
            raise ConfigError(f"gradient buckets and leaves differ in {sorted(missing)}")
        self.left = [len(names) for names in buckets]  # tensors still to come, per bucket
        self.arrived: dict[str, int] = {}  # hooked gradients per tensor of the last microbatch (one per window)
        self.done: set[str] = set()
        self.next = 0  # the next bucket to hand over (buckets go in order)
        self.futures: list[Future] = []
        self.cuda = False
        self.device = None
        self.handles: list = []
        self.lock = threading.Lock()  # hooks may run on autograd's device thread
        self.pool: ThreadPoolExecutor | None = None

    def watch(self, leaves: dict[str, tuple[torch.Tensor, ...]], coords: list) -> None:
        """Before a microbatch's backward: for the last one, a hook on every per-window leaf adds its gradient."""
        if list(coords) != self.last:
            return
        self.observe("last_microbatch", -1)
        for name, per in leaves.items():
            for leaf in per:
                self.handles.append(leaf.register_hook(self._hook(name, len(per))))
            if per and per[0].device.type == "cuda":
                self.cuda, self.device = True, per[0].device

    def run(self, parts: Iterable[tuple[object, dict[str, torch.Tensor]]]) -> list:
        """Consume `parts` (coord, grads), one per window, lazily."""
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="grad-reduce") as self.pool:
                if not self.last:
                    self.observe("last_microbatch", -1)
                seen = 0
                for coord, g in parts:
                    seen += 1
                    if coord not in self.last:
                        for k, v in g.items():
                            self.add(k, v)
                        continue
                    with self.lock:  # gradients no hook saw: the unused leaves' zeros, window by window
                        for k, v in g.items():
                            if k not in self.done and k not in self.arrived:
                                self.add(k, v)
                if seen != self.windows:
                    raise ConfigError(f"gradient reduction: got {seen} partials, expected {self.windows}")
                with self.lock:
                    for k in self.bucket_of:  # unused leaves, and a rank without windows: its sums are complete
                        if k not in self.done:
                            self._mark(k)
                return [f.result() for f in self.futures]
        finally:
            for h in self.handles:
                h.remove()

    def _hook(self, name: str, windows: int):
        def hook(grad: torch.Tensor) -> None:
            with self.lock:
                if name in self.done:
                    raise ConfigError(f"gradient reduction: the gradient of {name} arrived twice in one backward")
                self.add(name, grad)
                self.arrived[name] = self.arrived.get(name, 0) + 1
                if self.arrived[name] == windows:  # every window's gradient is in
                    self.observe("gradient", self.bucket_of[name])
                    self._mark(name)
        return hook

    def _mark(self, name: str) -> None:
        """`name` is in its sum: hand over every complete bucket that is next in order (caller holds the lock)."""
        self.done.add(name)
        self.left[self.bucket_of[name]] -= 1
        while self.next < len(self.buckets) and self.left[self.next] == 0:
            i = self.next
            self.next += 1
            self.observe("ready", i)
            event = None
            if self.cuda:  # the communication thread's kernels wait for the adds queued on this stream
                event = torch.cuda.Event()
                event.record()
            self.futures.append(self.pool.submit(self._reduce, i, event))

    def _reduce(self, i: int, event) -> object:
        if event is not None:
            torch.cuda.set_device(self.device)  # the current device is per thread
            torch.cuda.current_stream().wait_event(event)
        self.observe("start", i)
        out = self.reduce_bucket(self.buckets[i])
        self.observe("done", i)
        return out
