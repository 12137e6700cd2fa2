import pytest
import torch

from collectives.allreduce import narrow, schedule, simulate_allreduce, widen
from collectives.schedule import allreduce_schedule, blocks, check_schedule
from collectives.treefold import treefold


@pytest.mark.parametrize("world", range(1, 10))
def test_simulated_allreduce_equals_treefold(world, h):
    n = 1000 * world + 1  # not a multiple of the world size (for world > 1)
    assert world == 1 or n % world
    ps = h.partials(world, n, seed=world)
    ref = treefold(ps)
    out = simulate_allreduce(ps)
    assert len(out) == world
    for r, x in enumerate(out):
        assert h.same_bits(x, ref), f"rank {r} of {world} differs from TreeFold"


def test_the_check_can_fail(h):
    """For some R, TreeFold's order differs in bits from a naive left-to-right sum (so the test above has teeth)."""
    differs = []
    for world in range(1, 10):
        ps = h.partials(world, 2001, seed=world)
        differs.append(not h.same_bits(treefold(ps), h.left_to_right(ps)))
    assert differs[:3] == [False, False, False]  # R <= 3: the canonical tree is the left-to-right sum
    assert all(differs[3:])


def test_inputs_are_not_modified(h):
    ps = h.partials(5, 100)
    before = [p.clone() for p in ps]
    simulate_allreduce(ps)
    assert all(h.same_bits(a, b) for a, b in zip(ps, before))


@pytest.mark.parametrize("world", range(1, 33))
def test_schedule_is_consistent_and_short(world):
    rounds = allreduce_schedule(world)
    check_schedule(rounds)
    k = world.bit_length() - 1
    power_of_two = world & (world - 1) == 0
    assert len(rounds) == k if power_of_two else k + 2  # butterfly, then combine and broadcast
    assert sum(size for _, size in blocks(world)) == world


def test_schedule_of_six():
    """R = 6 = 4 + 2: two butterfly rounds, ranks 0-3 fold in block (4,5), ranks 4,5 get the total back."""
    s = schedule(6)
    assert [st.fold for st in s[0]] == [(0, 1), (0, 1), (2, 3), (2, 3), (4, 5), (4, 5)]
    assert [st.fold for st in s[1][:4]] == [(0, 2), (1, 3), (0, 2), (1, 3)] and s[1][4].idle
    assert [st.fold for st in s[2][:4]] == [(0, 4), (1, 5), (2, 4), (3, 5)]
    assert s[2][4].sends == (0, 2) and s[2][5].sends == (1, 3)
    assert s[3][4].fold == (0,) and s[3][5].fold == (1,) and s[3][0].sends == (4,)


def test_narrow_and_widen_carry_every_value_of_the_width():
    """The packed wire's bytes: a value of `width` bytes' two's complement range comes back as it went, its extremes
    and signs included; one outside the range does not (the caller's bound is what makes the wire exact)."""
    for width in (1, 3, 7):
        top = 1 << (8 * width - 1)
        vals = torch.tensor([0, 1, -1, top - 1, -top, 12345 % top, -(12345 % top), top // 3, -top // 3],
                            dtype=torch.int64)
        packed = narrow(vals, width)
        assert packed.shape == (vals.numel(), width) and packed.dtype == torch.uint8
        assert torch.equal(widen(packed), vals)
        assert not torch.equal(widen(narrow(torch.tensor([top, -top - 1]), width)), torch.tensor([top, -top - 1]))


@pytest.mark.parametrize("width", [5, 6, 7])
def test_the_cpu_byte_loops_are_the_torch_ops(width):
    """collectives/wire_cpu.py's narrow and widen-add (the packed wire on a CPU) against `narrow` and `widen`."""
    from collectives import wire_cpu

    if wire_cpu.library() is None:
        pytest.fail(f"wire_cpu not built: {wire_cpu.status()}")
    top = 1 << (8 * width - 1)
    g = torch.Generator().manual_seed(width)
    vals = torch.cat([torch.tensor([0, -1, 1, top - 1, -top]), torch.randint(-top, top, (997,), generator=g)])
    out = torch.empty((vals.numel(), width), dtype=torch.uint8)
    wire_cpu.narrow(vals, width, out)
    assert torch.equal(out, narrow(vals, width))
    acc = torch.randint(-(1 << 62), 1 << 62, (vals.numel(),), generator=g)
    want = acc + widen(out)
    wire_cpu.widen_add(out, acc, assign=False)
    assert torch.equal(acc, want)
    wire_cpu.widen_add(out, acc, assign=True)
    assert torch.equal(acc, vals)
