"""The NumPy Philox4x32-10 (the twin of boltzmann.cu's generator), on the CPU.

Known-answer vectors: Random123's ``kat_vectors`` for philox4x32_10.
"""

from __future__ import annotations

import numpy as np
import pytest

from foxhunt_core import explore
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.philox import bits_to_uniform, boltzmann_uniforms, philox4x32_10, split64

KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answers(ctr, key, expected):
    out = philox4x32_10(np.array(ctr, np.uint32), np.array(key, np.uint32))
    assert out.dtype == np.uint32
    assert out.tolist() == expected


def test_vectorized_equals_one_at_a_time():
    rng = np.random.default_rng()
    ctr = rng.integers(0, 2**32, (7, 5, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2**32, 2, dtype=np.uint64).astype(np.uint32)
    batch = philox4x32_10(ctr, key)
    assert batch.shape == (7, 5, 4)
    for idx in np.ndindex(7, 5):
        assert np.array_equal(batch[idx], philox4x32_10(ctr[idx], key))
    # The KAT vectors again, in one call with a broadcast key per row.
    ctrs = np.array([c for c, _, _ in KAT], np.uint32)
    keys = np.array([k for _, k, _ in KAT], np.uint32)
    assert philox4x32_10(ctrs, keys).tolist() == [e for _, _, e in KAT]


def test_uniforms_are_in_unit_interval_and_keyed():
    u = boltzmann_uniforms(seed=2**40 + 3, counter=9, batch=1000, num_branches=6)
    assert u.shape == (1000, 6) and (u >= 0).all() and (u < 1).all()
    assert abs(u.mean() - 0.5) < 0.03
    # No structure repeats across samples, branches or groups (24-bit values: a rare exact tie).
    assert len(np.unique(u)) > 0.999 * u.size
    assert not np.array_equal(u, boltzmann_uniforms(2**40 + 3, 10, 1000, 6))
    assert not np.array_equal(u, boltzmann_uniforms(2**40 + 4, 9, 1000, 6))
    # Branches 0..3 come from group 0, so the first four match a four-branch draw.
    assert np.array_equal(u[:, :4], boltzmann_uniforms(2**40 + 3, 9, 1000, 4))
    # Sample b's words are philox((b, counter_lo, counter_hi, group), seed).
    bits = philox4x32_10(np.array([5, 9, 0, 1], np.uint32), np.array(split64(2**40 + 3), np.uint32))
    assert np.array_equal(u[5, 4:6], bits_to_uniform(bits[:2]))


def test_bits_to_uniform_edges():
    assert bits_to_uniform(np.array([0, 255, 256, 0xFFFFFFFF], np.uint32)).tolist() == [
        0.0, 0.0, 2.0**-24, 1.0 - 2.0**-24,
    ]
    with pytest.raises(ValueError):
        split64(2**64)


def test_reference_boltzmann_uses_the_philox_uniforms():
    rng = np.random.default_rng()
    values = rng.normal(0, 1.0, (300, 12))
    temps = np.array([0.5, 1.0, 2.0, 0.3])
    offsets = (0, 3, 6, 9, 12)
    got = R.boltzmann_select(values, offsets, temps, seed=77, counter=3)
    u = boltzmann_uniforms(77, 3, 300, 4)
    assert np.array_equal(got, explore.boltzmann_select(values, offsets, temps, u))
