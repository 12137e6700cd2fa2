import math

import pytest
import torch

from collectives.treefold import TreeFold, canonical_tree, treefold


def test_canonical_tree_small_counts():
    assert canonical_tree(1) == "0"
    assert canonical_tree(3) == "((0+1)+2)"
    assert canonical_tree(6) == "(((0+1)+(2+3))+(4+5))"
    assert canonical_tree(7) == "((((0+1)+(2+3))+(4+5))+6)"


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5, 7, 8, 9])
def test_treefold_follows_the_canonical_tree(world, h):
    """Evaluating canonical_tree's expression with plain adds gives TreeFold's bits."""
    ps = h.partials(world, 257, seed=world)
    expr = canonical_tree(world)
    got = eval(_names(expr), {}, {f"p{i}": p for i, p in enumerate(ps)})
    assert h.same_bits(treefold(ps), got)


def _names(expr: str) -> str:
    out, num = [], ""
    for c in expr + " ":
        if c.isdigit():
            num += c
            continue
        if num:
            out.append(f"p{num}")
            num = ""
        out.append(c)
    return "".join(out).strip()


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8, 9, 13, 16])
def test_spilling_gives_the_same_bits_and_resident_bound(world, h, tmp_path):
    ps = h.partials(world, 1000, seed=100 + world)
    mem, disk = TreeFold(), TreeFold(spill=True, spill_dir=tmp_path)
    for p in ps:
        mem.push(p)
        disk.push(p)
    bound = math.ceil(math.log2(world)) + 1
    assert mem.max_resident <= bound
    assert disk.max_resident <= 2  # only the operands of the current addition
    if world & (world - 1) == 0:
        assert mem.max_resident == bound  # the bound is reached at powers of two (the paper: 4 at R = 8)
    r_mem, r_disk = mem.result(), disk.result()
    assert h.same_bits(r_mem, r_disk)
    assert list(tmp_path.iterdir()) == []  # spill directory removed


def test_spill_files_are_written_when_entries_go_dormant(h, tmp_path):
    ps = h.partials(6, 64)
    tf = TreeFold(spill=True, spill_dir=tmp_path)
    for p in ps[:3]:
        tf.push(p)
    files = list(tmp_path.rglob("*.safetensors"))
    assert len(files) == 1 and tf.resident == 1  # (p0+p1) on disk, p2 in memory
    for p in ps[3:]:
        tf.push(p)
    assert h.same_bits(tf.result(), treefold(ps))


def test_pushed_partials_are_not_modified(h):
    ps = h.partials(5, 33)
    before = [p.clone() for p in ps]
    treefold(ps)
    assert all(h.same_bits(a, b) for a, b in zip(ps, before))


def test_result_of_one_partial_is_a_copy(h):
    p = h.partials(1, 8)[0]
    r = treefold([p])
    assert h.same_bits(r, p) and r.data_ptr() != p.data_ptr()


def test_misuse_raises(h):
    with pytest.raises(ValueError):
        TreeFold().result()
    tf = TreeFold()
    tf.push(torch.ones(2))
    tf.result()
    with pytest.raises(RuntimeError):
        tf.push(torch.ones(2))


@pytest.mark.parametrize("spill", [False, True])
def test_named_partials_fold_per_name(spill, h, tmp_path):
    """A dict of named tensors (a model's gradients) folds each name as its own TreeFold."""
    world = 7
    a, b = h.partials(world, 50, seed=1), h.partials(world, 33, seed=2)
    tf = TreeFold(spill=spill, spill_dir=tmp_path)
    for x, y in zip(a, b):
        tf.push({"w": x, "b": y.reshape(3, 11)})
    out = tf.result()
    assert h.same_bits(out["w"], treefold(a)) and h.same_bits(out["b"], treefold(b).reshape(3, 11))
    with pytest.raises(ValueError):
        treefold([{"w": a[0]}, {"v": a[1]}])
