"""FlatTree on NumPy: layout, views that write through, copies in and out, use with optim.Adam."""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core.gpu.flat import FlatTree, Shared
from foxhunt_core.optim import Adam

SHAPES = {"core": {"w": (5, 7), "b": (7,), "s": ()}, "plugin": {"coef": (3, 2, 4)}, "empty_owner": {}}


def test_layout_is_aligned_and_in_order():
    f = FlatTree(SHAPES, align=16)
    offs = [f.slots["core"]["w"].offset, f.slots["core"]["b"].offset, f.slots["core"]["s"].offset,
            f.slots["plugin"]["coef"].offset]
    assert offs == [0, 48, 64, 80]  # 35 -> 48, 7 -> 16, 1 -> 16
    assert f.size == 80 + 32 and f.buffer.shape == (112,) and f.buffer.dtype == np.float32
    assert f.tree["empty_owner"] == {} and len(f) == 4
    assert all(o % 16 == 0 for o in offs)


def test_views_write_through_and_padding_stays_zero():
    f = FlatTree(SHAPES, align=16)
    w = f.view("core", "w")
    assert w.shape == (5, 7) and np.shares_memory(w, f.buffer) and w.flags.c_contiguous
    w[...] = 1.0
    f.tree["plugin"]["coef"][1] = 2.0
    f.tree["core"]["s"][...] = 3.0
    assert f.buffer[:35].sum() == 35.0 and f.buffer[35:48].sum() == 0.0
    assert f.buffer.sum() == 35.0 + 2.0 * 8 + 3.0
    f.buffer[:] = 0.0  # and the other way round: the buffer writes the views
    assert w.sum() == 0.0


def test_from_tree_copies_values_and_zeros_like_keeps_layout():
    rng = np.random.default_rng()
    tree = {"core": {"a": rng.normal(size=(4, 3)), "b": rng.normal(size=(9,))}, "x": {"c": rng.normal(size=(2,))}}
    f = FlatTree.from_tree(tree)
    assert f.dtype == np.float64
    for o, k, v in f.items():
        np.testing.assert_array_equal(v, tree[o][k])
    tree["core"]["a"][0, 0] = 99.0  # a copy, not a view of the source
    assert f.view("core", "a")[0, 0] != 99.0
    g = f.zeros_like(np.float32)
    assert g.shapes() == f.shapes() and g.size == f.size and g.dtype == np.float32 and not g.buffer.any()


def test_load_rejects_foreign_layouts():
    f = FlatTree(SHAPES)
    with pytest.raises(ValueError, match="core/w: shape"):
        f.load({"core": {"w": np.zeros((7, 5))}})
    with pytest.raises(KeyError, match="nope"):
        f.load({"core": {"nope": np.zeros(3)}})
    with pytest.raises(KeyError, match="ghost"):
        f.load({"ghost": {}})
    with pytest.raises(ValueError, match="align"):
        FlatTree(SHAPES, align=0)


def test_adam_on_flat_views_equals_adam_on_separate_arrays():
    rng = np.random.default_rng()
    shapes = {"core": {"w": (6, 5), "b": (5,)}, "plug": {"c": (3,)}}
    params = {o: {k: rng.normal(size=s) for k, s in sub.items()} for o, sub in shapes.items()}
    flat = FlatTree.from_tree(params)
    sep = {o: {k: v.copy() for k, v in sub.items()} for o, sub in params.items()}
    opt_flat = Adam(flat.tree, 1e-2, clip_norm=1.0)
    opt_sep = Adam(sep, 1e-2, clip_norm=1.0)
    for _ in range(3):
        grads = {o: {k: rng.normal(size=s) for k, s in sub.items()} for o, sub in shapes.items()}
        assert opt_flat.step(flat.tree, grads) == opt_sep.step(sep, grads)
    for o, k, v in flat.items():
        np.testing.assert_array_equal(v, sep[o][k])
    assert not flat.buffer[5 * 6 : 64].any()  # padding untouched


def test_padded_storage_blocks():
    f = FlatTree(SHAPES, align=16, storage={"core": {"w": (8, 8)}})
    w, blk = f.view("core", "w"), f.storage["core"]["w"]
    assert w.shape == (5, 7) and blk.shape == (8, 8) and np.shares_memory(w, blk)
    assert f.slots["core"]["b"].offset == 64  # the block's 64 floats come first
    assert f.tree["core"].storage == {"w": blk} and f.storage_shapes() == {"core": {"w": (8, 8)}, "plugin": {},
                                                                           "empty_owner": {}}
    w[...] = 1.0  # the view is the block's top-left corner; the rest of the block stays zero
    assert blk[:5, :7].sum() == 35.0 and blk.sum() == 35.0
    g = f.zeros_like()
    assert g.storage["core"]["w"].shape == (8, 8) and g.view("core", "w").shape == (5, 7)
    c = f.copy()
    assert np.array_equal(c.buffer, f.buffer) and not np.shares_memory(c.buffer, f.buffer)
    loaded = FlatTree.from_tree({"core": {"w": np.full((5, 7), 2.0)}}, storage={"core": {"w": (5, 8)}})
    assert loaded.storage["core"]["w"].sum() == 70.0 and not loaded.storage["core"]["w"][:, 7].any()


@pytest.mark.parametrize("block", [(4, 8), (5, 6), (8,), (5, 7, 1)])
def test_storage_must_hold_the_tensor(block):
    with pytest.raises(ValueError, match="core/w: storage"):
        FlatTree(SHAPES, storage={"core": {"w": block}})


def test_shared_blocks_hold_two_tensors_side_by_side():
    shapes = {"core": {"a": (3, 4), "b": (3, 4), "ba": (4,), "bb": (4,), "c": (2,)}}
    spec = {"core": {"a": (4, 8), "b": Shared("a", 4), "ba": (8,), "bb": Shared("ba", 4)}}
    f = FlatTree(shapes, align=8, storage=spec)
    blk = f.storage["core"]["a"]
    assert blk is f.storage["core"]["b"] and f.storage["core"]["ba"] is f.storage["core"]["bb"]
    assert f.slots["core"]["b"].size == 0 and f.size == 32 + 8 + 8  # b and bb take no space
    f.view("core", "a")[...] = 1.0
    f.view("core", "b")[...] = 2.0
    f.view("core", "bb")[...] = 3.0
    assert np.array_equal(blk[:3], np.repeat([[1.0] * 4 + [2.0] * 4], 3, axis=0)) and not blk[3].any()
    assert np.array_equal(f.storage["core"]["ba"], [0, 0, 0, 0, 3, 3, 3, 3])
    g = f.zeros_like()
    assert g.storage["core"]["a"] is g.storage["core"]["b"] and g.size == f.size
    assert list(f.tree["core"]) == ["a", "b", "ba", "bb", "c"]  # the tree keeps its order


@pytest.mark.parametrize("spec,match", [
    (Shared("a", 2), "core/b: overlaps a"),   # overlaps a's own columns
    (Shared("a", 5), "does not fit in the block"),   # runs past the block
    (Shared("c", 4), "which has none of its own"),
    (Shared("zz", 4), "which has none of its own"),
])
def test_shared_blocks_are_checked(spec, match):
    storage = {"core": {"a": (3, 8), "b": spec}}
    with pytest.raises(ValueError, match=match):
        FlatTree({"core": {"a": (3, 4), "b": (3, 4), "c": (2,)}}, storage=storage)


def test_a_vector_may_live_in_a_row_of_a_matrix_block():
    # The GPU network's layout: weights [K, H] with the bias in the block's last row.
    shapes = {"core": {"w": (3, 4), "v": (3, 4), "b": (4,), "c": (4,)}}
    spec = {"core": {"w": (4, 8), "v": Shared("w", 4), "b": Shared("w", 0, row=3), "c": Shared("w", 4, row=3)}}
    f = FlatTree(shapes, align=8, storage=spec)
    f.view("core", "w")[...] = 1.0
    f.view("core", "v")[...] = 2.0
    f.view("core", "b")[...] = 3.0
    f.view("core", "c")[...] = 4.0
    blk = f.storage["core"]["w"]
    assert np.array_equal(blk[3], [3, 3, 3, 3, 4, 4, 4, 4])
    assert np.array_equal(blk[:3], np.repeat([[1.0] * 4 + [2.0] * 4], 3, axis=0))
    assert f.size == 32 and all(f.slots["core"][n].size == 0 for n in "vbc")
    g = f.zeros_like()
    assert g.storage["core"]["w"] is g.storage["core"]["b"]
    g.load({"core": {"b": np.arange(4.0)}})
    assert np.array_equal(g.storage["core"]["w"][3, :4], np.arange(4.0))


@pytest.mark.parametrize("spec,match", [
    (Shared("w", 0, row=2), "core/b: overlaps w"),       # the weights' own rows
    (Shared("w", 6, row=3), "does not fit in the block"),  # past the last column
    (Shared("w", 0, row=4), "does not fit in the block"),  # past the last row
])
def test_row_shared_vectors_are_checked(spec, match):
    storage = {"core": {"w": (4, 8), "b": spec}}
    with pytest.raises(ValueError, match=match):
        FlatTree({"core": {"w": (3, 4), "b": (4,)}}, storage=storage)


def test_stacked_trees_share_one_allocation_at_a_constant_stride():
    spec = {"core": {"a": (4, 8)}}
    trees = FlatTree.stacked(3, {"core": {"a": (3, 4), "b": (5,)}}, align=8, storage=spec)
    stride = trees[0].size
    base = trees[0].buffer.__array_interface__["data"][0]
    for i, t in enumerate(trees):
        assert t.buffer.__array_interface__["data"][0] == base + 4 * i * stride
        assert t.storage["core"]["a"].__array_interface__["data"][0] == base + 4 * i * stride
        t.view("core", "b")[...] = float(i)
    assert [float(t.view("core", "b")[0]) for t in trees] == [0.0, 1.0, 2.0]
    assert not trees[1].storage["core"]["a"].any()  # zeroed, padding included
    with pytest.raises(ValueError, match="buffer must be"):
        FlatTree({"core": {"a": (3, 4)}}, buffer=np.zeros(5, dtype=np.float32))
