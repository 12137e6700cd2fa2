r"""TreeFold: the canonical replica fold, online, with O(log R) partials resident (report appendix A.1).

The canonical fold of partials p_0..p_{R-1} (the tree the cluster's all-reduce also builds):

1. Write R in binary, highest bit first: R = 2^k1 + 2^k2 + ... (k1 > k2 > ...). This cuts the replicas
   into consecutive blocks B_1 = [0, 2^k1), B_2 = [2^k1, 2^k1 + 2^k2), ...: largest block first.
2. Within a block of 2^k replicas, the perfect binary tree: adjacent pairs, then adjacent pairs of
   pairs, ..., always the lower replicas' sum on the left (this is what binary-counter carries build).
3. Blocks are folded left to right in ascending level order (largest block first):
   S = ((B_1 + B_2) + B_3) + ...

R = 7 = 4 + 2 + 1:

    p0  p1  p2  p3   p4  p5   p6
     \  /    \  /     \  /    |
     (01)    (23)     (45)    |
        \    /         |      |
        (0123)         |      |        blocks: B_1 = (0123), B_2 = (45), B_3 = p6
             \        /       |
             (0123)+(45)      |
                      \      /
              ((0123)+(45))+p6

TreeFold builds this online: push(p_r) for r = 0..R-1 in order keeps a stack of (level, partial),
one entry per completed block; an incoming entry equal in level to the top combines with it
(top + incoming, lower replicas left) and carries up, as in binary counting. `result()` then folds
the remaining stack bottom (largest block) to top. At most ceil(log2 R) + 1 partials are held; with
spilling, entries that the next push cannot touch live on disk (safetensors, never pickle).
"""
from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch


def canonical_tree(r: int, lo: int = 0) -> str:
    """The canonical fold of replicas lo..lo+r-1 as a parenthesized expression, e.g. ((0+1)+2) for r=3."""
    if r < 1:
        raise ValueError(f"replica count must be >= 1, got {r}")
    blocks, start = [], lo
    for k in reversed(range(r.bit_length())):
        if r >> k & 1:
            blocks.append(_block_tree(start, 1 << k))
            start += 1 << k
    expr = blocks[0]
    for b in blocks[1:]:
        expr = f"({expr}+{b})"
    return expr


def _block_tree(start: int, size: int) -> str:
    if size == 1:
        return str(start)
    half = size // 2
    return f"({_block_tree(start, half)}+{_block_tree(start + half, half)})"


Partial = torch.Tensor | dict[str, torch.Tensor]  # one tensor, or named tensors (e.g. a model's gradients)
_SOLE = "__tensor__"  # the key a plain tensor is spilled under


@dataclass
class _Entry:
    level: int
    first: int  # lowest replica folded into this entry
    tensor: Partial | None  # None while spilled
    owned: bool = False  # False: the caller's pushed partial, never modified in place
    path: Path | None = None
    device: dict[str, torch.device] | None = None


class TreeFold:
    """Binary-carry fold of replica partials pushed in replica order; `result()` gives the canonical sum.

    spill=True keeps dormant entries in a temporary directory (under spill_dir if given) so that only
    the operands of the current addition are in memory. `resident` / `max_resident` count partials held
    in memory by the fold (the incoming one included).
    """

    def __init__(self, spill: bool = False, spill_dir: str | Path | None = None) -> None:
        self.spill = spill
        self._stack: list[_Entry] = []
        self._pushed = 0
        self._tmp: Path | None = Path(tempfile.mkdtemp(prefix="treefold-", dir=spill_dir)) if spill else None
        self._files = 0
        self._closed = False
        self.max_resident = 0

    @property
    def pushed(self) -> int:
        return self._pushed

    @property
    def resident(self) -> int:
        return sum(e.tensor is not None for e in self._stack)

    def _note(self, extra: int = 0) -> None:
        self.max_resident = max(self.max_resident, self.resident + extra)

    def push(self, partial: Partial) -> None:
        """Fold in the partial of the next replica (replicas in order 0, 1, 2, ...).

        The fold may keep a reference to `partial` (never writing to it): do not modify it after pushing.
        """
        if self._closed:
            raise RuntimeError("TreeFold already finished: its result() was taken")
        self._stack.append(_Entry(0, self._pushed, partial))
        self._pushed += 1
        self._note()
        while len(self._stack) >= 2 and self._stack[-1].level == self._stack[-2].level:
            hi = self._stack.pop()
            lo = self._stack.pop()
            self._load(lo)
            self._note(extra=2)
            # bit-relevant: the lower replicas' block on the left, one elementwise add
            self._stack.append(_Entry(lo.level + 1, lo.first, _add(lo, hi.tensor), owned=True))
        if self.spill:
            self._spill_dormant()

    def result(self) -> Partial:
        """The canonical fold of everything pushed: the stack folded bottom (largest block) to top."""
        if not self._stack:
            raise ValueError("TreeFold.result() with nothing pushed")
        try:
            first = self._stack[0]
            self._load(first)
            for e in self._stack[1:]:
                self._load(e)
                self._note()
                # bit-relevant: the earlier (lower-replica, larger) block on the left
                first.tensor, first.owned = _add(first, e.tensor), True
                e.tensor = None
            assert first.tensor is not None
            return first.tensor if first.owned else _apply(lambda t: t.clone(), first.tensor)
        finally:
            self.close()

    def close(self) -> None:
        """Forget the stack and delete spill files."""
        self._stack = []
        self._closed = True
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> "TreeFold":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Spilling: an entry is dormant unless it is the top at level 0 (the only one the next push adds to).
    def _spill_dormant(self) -> None:
        from safetensors.torch import save_file  # imported only when spilling: GPU boxes may lack it

        for i, e in enumerate(self._stack):
            live = i == len(self._stack) - 1 and e.level == 0
            if e.tensor is not None and not live:
                assert self._tmp is not None
                e.path = self._tmp / f"p{self._files}.safetensors"
                self._files += 1
                named = e.tensor if isinstance(e.tensor, dict) else {_SOLE: e.tensor}
                e.device = {k: t.device for k, t in named.items()}
                save_file({k: t.detach().contiguous().cpu() for k, t in named.items()}, str(e.path))
                e.tensor = None

    def _load(self, e: _Entry) -> Partial:
        if e.tensor is None:
            from safetensors.torch import load_file

            assert e.path is not None and e.device is not None
            named = {k: t.to(e.device[k]) for k, t in load_file(str(e.path)).items()}
            e.tensor, e.owned = (named[_SOLE] if set(named) == {_SOLE} else named), True
            e.path.unlink()
            e.path = None
        return e.tensor


def _apply(f, p: Partial) -> Partial:
    return {k: f(t) for k, t in p.items()} if isinstance(p, dict) else f(p)


def _add(lo: _Entry, hi: Partial) -> Partial:
    """lo + hi (per name for dicts), in place into lo's tensors when the fold owns them (same bits)."""
    a = lo.tensor
    assert a is not None
    if isinstance(a, dict) != isinstance(hi, dict) or (isinstance(a, dict) and a.keys() != hi.keys()):
        raise ValueError("TreeFold partials must all be tensors, or dicts with the same names")
    if isinstance(a, dict):
        return {k: a[k].add_(hi[k]) if lo.owned else a[k] + hi[k] for k in a}
    return a.add_(hi) if lo.owned else a + hi


def treefold(partials: list[Partial], spill: bool = False) -> Partial:
    """The canonical fold of `partials` (replica order)."""
    tf = TreeFold(spill=spill)
    for p in partials:
        tf.push(p)
    return tf.result()
