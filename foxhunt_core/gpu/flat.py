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

A 2-D tensor may be given a larger *storage* shape (``storage={owner: {name: (rows, cols)}}``):
its view is then the top-left corner of a zero-padded block, and the block itself is
:attr:`FlatTree.storage` (also reachable from the tree as ``tree[owner].storage[name]``). The GPU
network keeps the 153-column advantage and 51-column value weights in 156- and 52-column blocks
this way, so that cuBLAS runs their products on its aligned kernels; the padding stays zero as
long as what is written into it is zero (the padded gradients are).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[int, ...]
Tree = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in the flat buffer."""

    offset: int
    shape: Shape
    storage: Shape  # ``shape``, or a larger block whose top-left corner the tensor is

    @property
    def size(self) -> int:
        return int(np.prod(self.storage, dtype=np.int64))


class Views(dict):
    """One owner's ``{name: view}``, with the padded blocks of the tensors that have one in
    :attr:`storage` (``{name: block}``). A plain dict of arrays works wherever this does."""

    storage: dict[str, Any]


def storage_of(sub: Any, name: str) -> Any:
    """The padded storage block of ``sub[name]`` when ``sub`` is a :class:`Views` that has one,
    else None."""
    return getattr(sub, "storage", {}).get(name)


def _layout(shapes: Mapping[str, Mapping[str, Shape]], align: int,
            storage: Mapping[str, Mapping[str, Shape]]) -> tuple[dict[str, dict[str, Slot]], int]:
    if align < 1:
        raise ValueError(f"align must be at least 1, got {align}")
    slots: dict[str, dict[str, Slot]] = {}
    pos = 0
    for owner, sub in shapes.items():
        slots[owner] = {}
        for name, shape in sub.items():
            shape = tuple(int(s) for s in shape)
            if any(s < 0 for s in shape):
                raise ValueError(f"{owner}/{name}: negative dimension in shape {shape}")
            block = tuple(int(s) for s in storage.get(owner, {}).get(name, shape))
            if block != shape and (len(shape) != 2 or len(block) != 2 or block[0] < shape[0] or block[1] < shape[1]):
                raise ValueError(f"{owner}/{name}: storage {block} cannot hold a 2-D tensor of shape {shape}")
            slot = Slot(pos, shape, block)
            slots[owner][name] = slot
            pos += -(-slot.size // align) * align
    return slots, max(pos, align)


class FlatTree:
    """A parameter tree backed by one flat, zero-initialized buffer.

    Args:
        shapes: ``{owner: {name: shape}}``; the order of the mapping is the order in the buffer.
        xp: the array module (``numpy`` or ``cupy``).
        dtype: the buffer's dtype (float32 for training; float64 for reference checks).
        align: every tensor starts at a multiple of this many elements.
        storage: ``{owner: {name: (rows, cols)}}``, zero-padded blocks for some 2-D tensors.
    """

    def __init__(
        self,
        shapes: Mapping[str, Mapping[str, Shape]],
        xp: Any = np,
        dtype: Any = np.float32,
        align: int = 64,
        storage: Mapping[str, Mapping[str, Shape]] | None = None,
    ) -> None:
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.align = int(align)
        self.slots, self.size = _layout(shapes, self.align, storage or {})
        self.buffer = xp.zeros(self.size, dtype=self.dtype)
        self.tree: Tree = {}
        self.storage: dict[str, dict[str, Any]] = {}
        for owner, sub in self.slots.items():
            views = self.tree[owner] = Views()
            views.storage = self.storage[owner] = {}
            for name, slot in sub.items():
                block = self.buffer[slot.offset : slot.offset + slot.size].reshape(slot.storage)
                if slot.storage == slot.shape:
                    views[name] = block
                else:
                    views[name] = block[: slot.shape[0], : slot.shape[1]]
                    views.storage[name] = block

    @classmethod
    def from_tree(cls, tree: Mapping[str, Mapping[str, Any]], xp: Any = None, dtype: Any = None,
                  align: int = 64, storage: Mapping[str, Mapping[str, Shape]] | None = None) -> FlatTree:
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

    def shapes(self) -> dict[str, dict[str, Shape]]:
        return {o: {k: s.shape for k, s in sub.items()} for o, sub in self.slots.items()}

    def storage_shapes(self) -> dict[str, dict[str, Shape]]:
        """The padded blocks' shapes (only of the tensors that have one)."""
        return {o: {k: s.storage for k, s in sub.items() if s.storage != s.shape} for o, sub in self.slots.items()}

    def zeros_like(self, dtype: Any = None) -> FlatTree:
        """A new zero buffer with the same layout (for gradients and optimizer moments)."""
        return FlatTree(self.shapes(), xp=self.xp, dtype=self.dtype if dtype is None else dtype, align=self.align,
                        storage=self.storage_shapes())

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
