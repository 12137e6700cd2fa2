"""The message schedule of the deterministic all-reduce: who sends to whom, and what each rank adds in which order.

One schedule drives both the single-process simulation and the distributed run, so the two cannot drift.
For R = 2^k1 + 2^k2 + ... (k1 > k2 > ..., blocks B_1, B_2, ... of consecutive ranks, largest first):

1. Butterfly, k1 rounds: in round d (distance 2^d) every rank of a block of at least 2^(d+1) ranks
   swaps its value with partner rank ^ 2^d (inside the block) and keeps lower + higher. Afterwards every
   rank of a block holds that block's perfect-tree sum, bit for bit TreeFold's carry for the block.
2. Cross-block combine (one round, only when R is not a power of two): rank i of B_1 receives B_j's
   sum from B_j's rank (i mod |B_j|) for every j > 1 and folds ((B_1 + B_2) + B_3) + ... : TreeFold's
   `result()` order.
3. Broadcast (one round): rank |B_1| + i (outside B_1) receives the total from rank i of B_1;
   |B_1| > R - |B_1|, so one round reaches everyone.
Every rank ends with identical bits: the same adds in the same order on the same operands.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """One rank's part of one round.

    sends: ranks this rank sends its current value to. recvs: ranks it receives from (in this order).
    fold: ranks whose values (own current one, or received) are added left to right to form the new
    value; () keeps the current value; a single other rank means "replace with what that rank sent".
    """

    sends: tuple[int, ...] = ()
    recvs: tuple[int, ...] = ()
    fold: tuple[int, ...] = ()

    @property
    def idle(self) -> bool:
        return not (self.sends or self.recvs or self.fold)


def blocks(world: int) -> list[tuple[int, int]]:
    """The power-of-two blocks (start, size) of `world` ranks, largest first."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    out, start = [], 0
    for k in reversed(range(world.bit_length())):
        if world >> k & 1:
            out.append((start, 1 << k))
            start += 1 << k
    return out


def allreduce_schedule(world: int) -> list[list[Step]]:
    """rounds[t][rank]: the deterministic all-reduce of `world` ranks, round by round."""
    bl = blocks(world)
    rounds: list[list[Step]] = []
    # 1. butterfly within blocks: a round per doubling of the largest block
    for d in range(bl[0][1].bit_length() - 1):
        dist = 1 << d
        row = [Step() for _ in range(world)]
        for start, size in bl:
            if size <= dist:
                continue
            for r in range(start, start + size):
                p = start + ((r - start) ^ dist)
                # bit-relevant: the lower rank's value on the left
                row[r] = Step(sends=(p,), recvs=(p,), fold=(min(r, p), max(r, p)))
        rounds.append(row)
    if len(bl) == 1:
        return rounds
    # 2. cross-block combine into every rank of B_1, blocks in ascending level order (largest first)
    (s1, n1), rest = bl[0], bl[1:]
    row = [Step() for _ in range(world)]
    sends: dict[int, list[int]] = {r: [] for r in range(world)}
    for i in range(s1, s1 + n1):
        srcs = tuple(start + (i - s1) % size for start, size in rest)
        for s in srcs:
            sends[s].append(i)
        row[i] = Step(recvs=srcs, fold=(i,) + srcs)  # bit-relevant: ((B_1 + B_2) + B_3) + ...
    for r in range(s1 + n1, world):
        row[r] = Step(sends=tuple(sends[r]))
    rounds.append(row)
    # 3. broadcast the total back to the ranks outside B_1
    row = [Step() for _ in range(world)]
    for r in range(n1, world):
        row[r - n1] = Step(sends=(r,))
        row[r] = Step(recvs=(r - n1,), fold=(r - n1,))
    rounds.append(row)
    return rounds


def check_schedule(rounds: list[list[Step]]) -> None:
    """Every send has its matching receive in the same round, and folds use only own or received values."""
    for t, row in enumerate(rounds):
        sent = sorted((r, p) for r, s in enumerate(row) for p in s.sends)
        got = sorted((p, r) for r, s in enumerate(row) for p in s.recvs)
        if sent != got:
            raise AssertionError(f"round {t}: sends {sent} do not match receives {got}")
        for r, s in enumerate(row):
            bad = [x for x in s.fold if x != r and x not in s.recvs]
            if bad:
                raise AssertionError(f"round {t}, rank {r}: folds values it never received from {bad}")
