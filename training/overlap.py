"""The cross-rank gradient reduction of a real group, bucket by bucket, overlapped with the last local backward.

A rank's microbatches stream into per-tensor ExactSums (training/reduction.py). Before the last one's backward
runs, a tensor hook on every leaf adds that leaf's gradient to its sum the moment autograd produces it (hooks fire
under torch.autograd.grad too). The tensors are cut into buckets in the order the backward produces them (the
reverse of the parameters' order in the model spec, the same on every rank); once all of a bucket's tensors are in,
the bucket goes to one communication thread, which reduces the buckets across ranks strictly in bucket order (so
every rank issues the same collectives in the same order, also a rank with no microbatch, which only adds zeros),
while the backward goes on producing the next buckets.

The bits are the unbucketed reduction's: every partial enters its ExactSum the same number of times, integer sums
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

    `leaves`: the step's autograd leaves by name; `add(name, grad, coord)`: puts a partial into the sums;
    `reduce_bucket(names)`: the cross-rank reduction of those tensors' sums (runs on the communication thread)."""

    def __init__(self, leaves: dict[str, torch.Tensor], buckets: list[tuple[str, ...]], microbatches: int,
                 add: Callable[[str, torch.Tensor, object], None], reduce_bucket: Callable[[tuple[str, ...]], object],
                 observer: Callable[[str, int], None] | None = None) -> None:
        self.leaves, self.buckets, self.last = leaves, buckets, microbatches - 1
        self.add, self.reduce_bucket = add, reduce_bucket
        self.observe = observer or (lambda event, bucket: None)
        self.bucket_of = {k: i for i, names in enumerate(buckets) for k in names}
        missing = set(leaves) ^ set(self.bucket_of)
        if missing:
            raise ConfigError(f"gradient buckets and leaves differ in {sorted(missing)}")
        self.left = [len(names) for names in buckets]  # tensors still to come, per bucket
        self.consumed = 0  # microbatches taken from `parts`; the hooks act while it equals `last`
        self.last_coord = None
        self.done: set[str] = set()
        self.next = 0  # the next bucket to hand over (buckets go in order)
        self.futures: list[Future] = []
        self.cuda = any(t.device.type == "cuda" for t in leaves.values())
        self.lock = threading.Lock()  # hooks may run on autograd's device thread
        self.pool: ThreadPoolExecutor | None = None

    def run(self, parts: Iterable[tuple[object, dict[str, torch.Tensor]]], last_coord) -> list:
        """Consume `parts` (coord, grads) lazily; `last_coord`: the last microbatch's coord (its weight's key)."""
        self.last_coord = last_coord
        handles = [t.register_hook(self._hook(k)) for k, t in self.leaves.items()]
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="grad-reduce") as self.pool:
                it = iter(parts)
                while True:
                    if self.consumed == self.last:
                        self.observe("last_microbatch", -1)
                    try:
                        coord, g = next(it)
                    except StopIteration:
                        break
                    if self.consumed < self.last:
                        for k, v in g.items():
                            self.add(k, v, coord)
                    else:
                        for k, v in g.items():  # gradients no hook saw: the unused leaves' zeros
                            if k not in self.done:
                                self._take(k, v)
                    self.consumed += 1
                if self.consumed != self.last + 1:
                    raise ConfigError(f"gradient reduction: got {self.consumed} microbatches, expected {self.last + 1}")
                with self.lock:
                    for k in self.bucket_of:  # a rank without microbatches: zero sums for every tensor
                        if k not in self.done:
                            self._mark(k)
                return [f.result() for f in self.futures]
        finally:
            for h in handles:
                h.remove()

    def _hook(self, name: str):
        def hook(grad: torch.Tensor) -> None:
            if self.consumed == self.last:
                self._take(name, grad)
        return hook

    def _take(self, name: str, grad: torch.Tensor) -> None:
        with self.lock:
            if name in self.done:
                raise ConfigError(f"gradient reduction: the gradient of {name} arrived twice in one backward")
            self.add(name, grad, self.last_coord)
            self.observe("gradient", self.bucket_of[name])
            self._mark(name)

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
            torch.cuda.set_device(next(iter(self.leaves.values())).device)  # the current device is per thread
            torch.cuda.current_stream().wait_event(event)
        self.observe("start", i)
        out = self.reduce_bucket(self.buckets[i])
        self.observe("done", i)
        return out
