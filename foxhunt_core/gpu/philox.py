"""Philox4x32-10 in vectorized NumPy: the reference twin of the generator in ``kernels/boltzmann.cu``.

Philox4x32-10 (Salmon, Moraes, Dror & Shaw 2011, "Parallel random numbers: as easy as 1, 2, 3")
is a counter-based generator: ``bits = philox(counter, key)`` with a 128-bit counter and a
64-bit key, so any draw can be recomputed from its coordinates alone. It is checked against the
published known-answer vectors of Random123 (``tests/gpu/test_gpu_philox.py``).

Keying used by the Boltzmann selection (identical on both sides)::

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (sample, counter & 0xffffffff, counter >> 32, d // 4)
    u[b, d] = (word d % 4 >> 8) * 2**-24          in [0, 1), exact in float32
"""

from __future__ import annotations

from typing import Any

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(32)


def philox4x32_10(counter: Any, key: Any) -> np.ndarray:
    """Philox4x32-10 of ``counter`` [..., 4] under ``key`` [..., 2] (uint32, broadcast) -> [..., 4] uint32."""
    c = np.asarray(counter, dtype=np.uint32)
    k = np.asarray(key, dtype=np.uint32)
    c0, c1, c2, c3 = (c[..., i] for i in range(4))
    k0, k1 = k[..., 0].copy(), k[..., 1].copy()
    with np.errstate(over="ignore"):
        for r in range(10):
            if r > 0:
                k0 = k0 + W0
                k1 = k1 + W1
            p0 = M0 * c0.astype(np.uint64)  # a 32 x 32 -> 64 bit product never overflows uint64
            p1 = M1 * c2.astype(np.uint64)
            hi0, lo0 = (p0 >> _SHIFT).astype(np.uint32), (p0 & _LO).astype(np.uint32)
            hi1, lo1 = (p1 >> _SHIFT).astype(np.uint32), (p1 & _LO).astype(np.uint32)
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return np.stack(np.broadcast_arrays(c0, c1, c2, c3), axis=-1).astype(np.uint32)


def split64(x: int) -> tuple[int, int]:
    """``(low, high)`` 32-bit words of a non-negative integer below 2**64."""
    x = int(x)
    if not 0 <= x < 2**64:
        raise ValueError(f"{x} does not fit in 64 unsigned bits")
    return x & 0xFFFFFFFF, x >> 32


def bits_to_uniform(bits: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) from uint32 words: the top 24 bits times 2**-24 (float64, exact)."""
    return (np.asarray(bits, dtype=np.uint32) >> np.uint32(8)).astype(np.float64) * 2.0**-24


def boltzmann_uniforms(seed: int, counter: int, batch: int, num_branches: int) -> np.ndarray:
    """The [batch, num_branches] uniforms that ``boltzmann_select`` on the GPU draws."""
    s_lo, s_hi = split64(seed)
    c_lo, c_hi = split64(counter)
    groups = (num_branches + 3) // 4
    ctr = np.zeros((batch, groups, 4), dtype=np.uint32)
    ctr[:, :, 0] = np.arange(batch, dtype=np.uint32)[:, None]
    ctr[:, :, 1] = c_lo
    ctr[:, :, 2] = c_hi
    ctr[:, :, 3] = np.arange(groups, dtype=np.uint32)[None, :]
    bits = philox4x32_10(ctr, np.array([s_lo, s_hi], dtype=np.uint32))
    return bits_to_uniform(bits.reshape(batch, groups * 4)[:, :num_branches])
