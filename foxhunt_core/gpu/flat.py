"""One flat buffer for a whole parameter tree, with a view per tensor.

The optimizer kernels (``kernels/adam.cu``) work on one contiguous float32 buffer each for the
parameters, the gradients and Adam's two moments: one global-norm reduction and one fused update
over every parameter of every owner, instead of a launch per tensor. :class:`FlatTree` lays a
tree ``{owner: {name: shape}}`` out in such a buffer and hands out per-tensor views, so the rest
of the engine keeps using the familiar ``{owner: {name: array}}`` trees — the views *are* the
arrays, and writing through them writes the buffer.

Each tensor starts at a multiple of ``align`` elements (64 floats = 256 bytes by default, the
CuPy allocation granularity); the gaps stay zero, so they add nothing to a gradient norm and an
Adam step leaves them at zero. Works with NumPy and CuPy alike (``xp``).

A tensor may be given a larger *storage* shape (``storage={owner: {name: (rows, cols)}}``, or
``(n,)`` for a vector): its view is then the top-left corner of a zero-padded block, and the
block itself is :attr:`FlatTree.storage` (also reachable from the tree as
``tree[owner].storage[name]``). Other tensors of the same owner may live in that block beside
it (``Shared(name, col, row)``: a matrix from column ``col`` on, its first row at the block's
row ``row`` (0 by default), or a vector in the block's row ``row``), so that tensors the GPU
uses together form one matrix. The GPU network keeps, for example, each GLU's gate and value
weights side by side in one [K, 2H] block with their biases in the block's last row (one GEMM
for both, the bias through a ones column of the input), and the 153-column advantage weights in
a 156-column block, so that cuBLAS runs their products on its aligned kernels. The padding stays
zero as long as what is written into it is zero (the padded gradients are).

Several trees of one layout can share one allocation at a constant stride (:meth:`FlatTree.stacked`),
so that the same tensor of each is at a fixed distance from the first's: one strided-batched GEMM
then runs a layer of all of them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[int, ...]
Tree = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Shared:
    """A storage spec: the tensor lives in ``name``'s padded block, from column ``col`` on; a
    vector in a matrix block lives in its row ``row``, a matrix from its row ``row`` down (from
    the top when ``row`` is None)."""

    name: str
    col: int = 0
    row: int | None = None


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in the flat buffer."""

    offset: int
    shape: Shape
    storage: Shape  # ``shape``, or a larger block of which the tensor is a corner or a part
    col: int = 0  # first column (element, for a vector) of the tensor in its block
    shared: bool = False  # the block is another tensor's (this one takes no space of its own)
    row: int | None = None  # a vector in a matrix block: its row; a matrix: its first row

    @property
    def size(self) -> int:
        return 0 if self.shared else int(np.prod(self.storage, dtype=np.int64))


class Views(dict):
    """One owner's ``{name: view}``, with the padded blocks of the tensors that have one in
    :attr:`storage` (``{name: block}``). A plain dict of arrays works wherever this does."""

    storage: dict[str, Any]


def storage_of(sub: Any, name: str) -> Any:
    """The padded storage block of ``sub[name]`` when ``sub`` is a :class:`Views` that has one,
    else None."""
    return getattr(sub, "storage", {}).get(name)


def _layout(shapes: Mapping[str, Mapping[str, Shape]], align: int,
            storage: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, dict[str, Slot]], int]:
    if align < 1:
        raise ValueError(f"align must be at least 1, got {align}")
    slots: dict[str, dict[str, Slot]] = {}
    pos = 0
    for owner, sub in shapes.items():
        slots[owner] = {}
        specs = storage.get(owner, {})
        for name, shape in sub.items():
            shape = tuple(int(s) for s in shape)
            if any(s < 0 for s in shape):
                raise ValueError(f"{owner}/{name}: negative dimension in shape {shape}")
            spec = specs.get(name, shape)
            if isinstance(spec, Shared):
                continue  # placed below, once its block is
            block = tuple(int(s) for s in spec)
            if block != shape and not _fits(shape, block, 0):
                raise ValueError(f"{owner}/{name}: storage {block} cannot hold a tensor of shape {shape}")
            slot = Slot(pos, shape, block)
            slots[owner][name] = slot
            pos += -(-slot.size // align) * align
        for name, spec in specs.items():
            if not isinstance(spec, Shared):
                continue
            if name not in sub:
                raise ValueError(f"{owner}/{name}: storage given for an unknown tensor")
            home = slots[owner].get(spec.name)
            shape = tuple(int(s) for s in sub[name])
            if home is None or home.shared or home.storage == home.shape:
                raise ValueError(f"{owner}/{name}: shares the block of {spec.name!r}, which has none of its own")
            if not _fits(shape, home.storage, spec.col, spec.row):
                where = f"column {spec.col}" + ("" if spec.row is None else f" of row {spec.row}")
                raise ValueError(f"{owner}/{name}: shape {shape} at {where} does not fit in the block "
                                 f"{home.storage} of {spec.name}")
            slots[owner][name] = Slot(home.offset, shape, home.storage, spec.col, shared=True, row=spec.row)
        _check_overlaps(owner, slots[owner])
        slots[owner] = {name: slots[owner][name] for name in sub}  # the tree's order
    return slots, max(pos, align)


def _fits(shape: Shape, block: Shape, col: int, row: int | None = None) -> bool:
    """Whether a tensor of ``shape`` fits in ``block`` from column ``col`` (same rank, 1 or 2,
    a matrix from row ``row`` down; or a vector in row ``row`` of a matrix block)."""
    if row is not None and len(shape) == 2:
        return len(block) == 2 and 0 <= row and row + shape[0] <= block[0] and 0 <= col and col + shape[1] <= block[1]
    if row is not None:
        return len(shape) == 1 and len(block) == 2 and 0 <= row < block[0] and 0 <= col and col + shape[0] <= block[1]
    if len(shape) != len(block) or len(shape) not in (1, 2):
        return False
    return all(s <= b for s, b in zip(shape[:-1], block[:-1])) and 0 <= col and col + shape[-1] <= block[-1]


def _rect(slot: Slot) -> tuple[int, int, int, int]:
    """``(row0, row1, col0, col1)`` a tensor covers in its block."""
    if slot.row is not None and len(slot.shape) == 2:
        return slot.row, slot.row + slot.shape[0], slot.col, slot.col + slot.shape[1]
    if slot.row is not None:
        return slot.row, slot.row + 1, slot.col, slot.col + slot.shape[0]
    rows = slot.shape[0] if len(slot.shape) == 2 else 1
    return 0, rows, slot.col, slot.col + slot.shape[-1]


def _check_overlaps(owner: str, slots: Mapping[str, Slot]) -> None:
    """No two tensors of a shared block may cover the same element."""
    by_block: dict[int, list[tuple[str, Slot]]] = {}
    for name, slot in slots.items():
        if slot.storage != slot.shape:
            by_block.setdefault(slot.offset, []).append((name, slot))
    for members in by_block.values():
        for i, (na, a) in enumerate(members):
            ra = _rect(a)
            for nb, b in members[i + 1:]:
                rb = _rect(b)
                if ra[0] < rb[1] and rb[0] < ra[1] and ra[2] < rb[3] and rb[2] < ra[3]:
                    raise ValueError(f"{owner}/{nb}: overlaps {na} in their block {a.storage}")


class FlatTree:
    """A parameter tree backed by one flat, zero-initialized buffer.

    Args:
        shapes: ``{owner: {name: shape}}``; the order of the mapping is the order in the buffer.
        xp: the array module (``numpy`` or ``cupy``).
        dtype: the buffer's dtype (float32 for training; float64 for reference checks).
        align: every tensor starts at a multiple of this many elements.
        storage: ``{owner: {name: spec}}`` for some 1-D or 2-D tensors: a larger shape (a
            zero-padded block with the tensor in its top-left corner) or ``Shared(other, col, row)``
            (the tensor sits in ``other``'s block from column ``col``; a vector in row ``row``).
        buffer: a zeroed 1-D array of at least the layout's size to live in (:meth:`stacked`);
            by default a new one is allocated.
    """

    def __init__(
        self,
        shapes: Mapping[str, Mapping[str, Shape]],
        xp: Any = np,
        dtype: Any = np.float32,
        align: int = 64,
        storage: Mapping[str, Mapping[str, Any]] | None = None,
        buffer: Any = None,
    ) -> None:
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.align = int(align)
        self.storage_spec = {o: dict(sub) for o, sub in (storage or {}).items()}
        self.slots, self.size = _layout(shapes, self.align, self.storage_spec)
        if buffer is None:
            self.buffer = xp.zeros(self.size, dtype=self.dtype)
        else:
            if buffer.ndim != 1 or buffer.shape[0] < self.size or buffer.dtype != self.dtype:
                raise ValueError(f"FlatTree: buffer must be a 1-D {self.dtype} array of at least {self.size} "
                                 f"elements, got {tuple(buffer.shape)} {buffer.dtype}")
            self.buffer = buffer[: self.size]
        self.tree: Tree = {}
        self.storage: dict[str, dict[str, Any]] = {}
        blocks: dict[int, Any] = {}  # one array per block: the tensors sharing it share the object
        for owner, sub in self.slots.items():
            views = self.tree[owner] = Views()
            views.storage = self.storage[owner] = {}
            for name, slot in sub.items():
                n = int(np.prod(slot.storage, dtype=np.int64))
                block = blocks.get(slot.offset) if slot.storage != slot.shape else None
                if block is None:
                    block = self.buffer[slot.offset : slot.offset + n].reshape(slot.storage)
                    if slot.storage != slot.shape:
                        blocks[slot.offset] = block
                if slot.storage == slot.shape:
                    views[name] = block
                    continue
                c0, c1 = slot.col, slot.col + slot.shape[-1]
                if slot.row is not None and len(slot.shape) == 2:
                    views[name] = block[slot.row : slot.row + slot.shape[0], c0:c1]
                elif slot.row is not None:
                    views[name] = block[slot.row, c0:c1]
                else:
                    views[name] = block[c0:c1] if len(slot.shape) == 1 else block[: slot.shape[0], c0:c1]
                views.storage[name] = block

    @classmethod
    def from_tree(cls, tree: Mapping[str, Mapping[str, Any]], xp: Any = None, dtype: Any = None,
                  align: int = 64, storage: Mapping[str, Mapping[str, Any]] | None = None) -> FlatTree:
        """A flat copy of ``tree`` (its layout and values); ``xp``/``dtype`` default to the first array's."""
        first = next((a for sub in tree.values() for a in sub.values()), None)
        if xp is None:
            xp = np if first is None or isinstance(first, np.ndarray) else _module_of(first)
        if dtype is None:
            dtype = np.float32 if first is None else first.dtype
        shapes = {o: {k: tuple(a.shape) for k, a in sub.items()} for o, sub in tree.items()}
        flat = cls(shapes, xp=xp, dtype=dtype, align=align, storage=storage)
        flat.load(tree)
        return flat

    @classmethod
    def stacked(cls, count: int, shapes: Mapping[str, Mapping[str, Shape]], xp: Any = np, dtype: Any = np.float32,
                align: int = 64, storage: Mapping[str, Mapping[str, Any]] | None = None) -> list[FlatTree]:
        """``count`` zeroed trees of one layout in one allocation, tree ``i`` at ``i * stride``
        elements (``stride`` the layout's size, a multiple of ``align``): every tensor of tree
        ``i`` is ``i * stride`` elements after the same tensor of tree 0."""
        if count < 1:
            raise ValueError(f"FlatTree.stacked: count must be at least 1, got {count}")
        first = cls(shapes, xp=xp, dtype=dtype, align=align, storage=storage)
        stride = first.size
        whole = xp.zeros(count * stride, dtype=first.dtype)
        return [cls(shapes, xp=xp, dtype=dtype, align=align, storage=storage, buffer=whole[i * stride:(i + 1) * stride])
                for i in range(count)]

    def shapes(self) -> dict[str, dict[str, Shape]]:
        return {o: {k: s.shape for k, s in sub.items()} for o, sub in self.slots.items()}

    def storage_shapes(self) -> dict[str, dict[str, Shape]]:
        """The shapes of the blocks the tensors that have one live in."""
        return {o: {k: s.storage for k, s in sub.items() if s.storage != s.shape} for o, sub in self.slots.items()}

    def zeros_like(self, dtype: Any = None) -> FlatTree:
        """A new zero buffer with the same layout (for gradients and optimizer moments)."""
        return FlatTree(self.shapes(), xp=self.xp, dtype=self.dtype if dtype is None else dtype, align=self.align,
                        storage=self.storage_spec)

    def copy(self) -> FlatTree:
        """A new buffer with the same layout and values (padding included)."""
        new = self.zeros_like()
        new.buffer[...] = self.buffer
        return new

    def load(self, tree: Mapping[str, Mapping[str, Any]]) -> None:
        """Copy the values of ``tree`` (NumPy or CuPy arrays of the same layout) into the views."""
        for owner, sub in tree.items():
            if owner not in self.slots:
                raise KeyError(f"FlatTree has no owner {owner!r}")
            for name, a in sub.items():
                slot = self.slots[owner].get(name)
                if slot is None:
                    raise KeyError(f"FlatTree has no tensor {owner}/{name}")
                if tuple(a.shape) != slot.shape:
                    raise ValueError(f"{owner}/{name}: shape {tuple(a.shape)}, expected {slot.shape}")
                self.tree[owner][name][...] = self.xp.asarray(a, dtype=self.dtype)

    def view(self, owner: str, name: str) -> Any:
        return self.tree[owner][name]

    def items(self) -> Iterator[tuple[str, str, Any]]:
        """``(owner, name, view)`` in buffer order."""
        for owner, sub in self.tree.items():
            for name, a in sub.items():
                yield owner, name, a

    def __len__(self) -> int:
        return sum(len(sub) for sub in self.slots.values())


def _module_of(a: Any) -> Any:
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np
