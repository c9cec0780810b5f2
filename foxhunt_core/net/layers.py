"""Elementwise and dense building blocks of the network, each with its hand-written backward.

Every function takes the array module ``xp`` implicitly through its inputs (NumPy or CuPy arrays
both work) and is dtype-preserving, so the float64 gradient checks and the float32 training path
run the same code.
"""

from __future__ import annotations

from typing import Any

Array = Any


def matmul(a: Array, b: Array) -> Array:
    """``a @ b``; on CuPy through :mod:`foxhunt_core.gpu.cublas` so it can be graph-captured."""
    if type(a).__module__.startswith("cupy"):
        from ..gpu import cublas

        return cublas.matmul(a, b)
    return a @ b


def linear(x: Array, w: Array, b: Array) -> Array:
    """``x @ w + b`` for ``x`` [B, I], ``w`` [I, O], ``b`` [O]."""
    return matmul(x, w) + b


def linear_backward(x: Array, w: Array, dy: Array) -> tuple[Array, Array, Array]:
    """Gradients of :func:`linear`: returns ``(dx, dw, db)``."""
    return matmul(dy, w.T), matmul(x.T, dy), dy.sum(axis=0)


def relu(x: Array) -> Array:
    return x * (x > 0)


def relu_backward(y: Array, dy: Array) -> Array:
    """Backward of ReLU from its *output* ``y`` (``y > 0`` iff the input was)."""
    return dy * (y > 0)


def sigmoid(x: Array) -> Array:
    # Split by sign so neither branch overflows in exp.
    xp = _xp(x)
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def sigmoid_backward(y: Array, dy: Array) -> Array:
    """Backward of the sigmoid from its output ``y``."""
    return dy * y * (1.0 - y)


def log_softmax(x: Array, axis: int = -1) -> Array:
    xp = _xp(x)
    m = x.max(axis=axis, keepdims=True)
    s = x - m
    return s - xp.log(xp.exp(s).sum(axis=axis, keepdims=True))


def softmax(x: Array, axis: int = -1) -> Array:
    xp = _xp(x)
    return xp.exp(log_softmax(x, axis=axis))


def softmax_backward(p: Array, dp: Array, axis: int = -1) -> Array:
    """Backward of softmax from its output ``p``: ``p * (dp - sum(p * dp))``."""
    return p * (dp - (p * dp).sum(axis=axis, keepdims=True))


def _xp(x: Array):
    """The array module of ``x`` (NumPy or CuPy) without importing CuPy on the CPU path."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy

        return cupy
    import numpy

    return numpy
