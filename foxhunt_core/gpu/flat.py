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
``tree[owner].storage[name]``). Another tensor of the same owner may live in that block beside
it (``Shared(name, col)``: its view starts at column ``col``), so that two tensors the GPU uses
together form one matrix. The GPU network keeps the 153-column advantage and 51-column value
weights in 156- and 52-column blocks this way, so that cuBLAS runs their products on its aligned
kernels, and each GLU's gate and value weights (and biases) side by side in one [K, 2H] block
(one GEMM for both); the padding stays zero as long as what is written into it is zero (the
padded gradients are).
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
    """A storage spec: the tensor lives in ``name``'s padded block, from column ``col`` on."""

    name: str
    col: int


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in the flat buffer."""

    offset: int
    shape: Shape
    storage: Shape  # ``shape``, or a larger block of which the tensor is a corner or a part
    col: int = 0  # first column (element, for a vector) of the tensor in its block
    shared: bool = False  # the block is another tensor's (this one takes no space of its own)

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
            own_end = home.shape[-1]
            if not _fits(shape, home.storage, spec.col) or spec.col < own_end:
                raise ValueError(f"{owner}/{name}: shape {shape} at column {spec.col} does not fit beside "
                                 f"{spec.name} in its block {home.storage}")
            slots[owner][name] = Slot(home.offset, shape, home.storage, spec.col, shared=True)
        slots[owner] = {name: slots[owner][name] for name in sub}  # the tree's order
    return slots, max(pos, align)


def _fits(shape: Shape, block: Shape, col: int) -> bool:
    """Whether a tensor of ``shape`` fits in ``block`` from column ``col`` (same rank, 1 or 2)."""
    if len(shape) != len(block) or len(shape) not in (1, 2):
        return False
    return all(s <= b for s, b in zip(shape[:-1], block[:-1])) and col + shape[-1] <= block[-1]


class FlatTree:
    """A parameter tree backed by one flat, zero-initialized buffer.

    Args:
        shapes: ``{owner: {name: shape}}``; the order of the mapping is the order in the buffer.
        xp: the array module (``numpy`` or ``cupy``).
        dtype: the buffer's dtype (float32 for training; float64 for reference checks).
        align: every tensor starts at a multiple of this many elements.
        storage: ``{owner: {name: spec}}`` for some 1-D or 2-D tensors: a larger shape (a
            zero-padded block with the tensor in its top-left corner) or ``Shared(other, col)``
            (the tensor sits in ``other``'s block from column ``col``).
    """

    def __init__(
        self,
        shapes: Mapping[str, Mapping[str, Shape]],
        xp: Any = np,
        dtype: Any = np.float32,
        align: int = 64,
        storage: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.align = int(align)
        self.storage_spec = {o: dict(sub) for o, sub in (storage or {}).items()}
        self.slots, self.size = _layout(shapes, self.align, self.storage_spec)
        self.buffer = xp.zeros(self.size, dtype=self.dtype)
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
