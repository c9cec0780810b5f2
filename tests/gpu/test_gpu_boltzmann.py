"""Parity of boltzmann.cu (Philox4x32-10 + per-branch inverse-CDF draw) with explore.py + philox.py.

The generator is exact: the device Philox must reproduce the Random123 known answers bit for bit.
The draw compares a float32 CDF with the uniform, so an action may differ from the float64
reference only where the uniform lies within 1e-5 of a CDF boundary (a near-tie); every other
action must be equal.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_parity import host64, to_dev

from foxhunt_core.gpu import kernels as K
from foxhunt_core.gpu import reference as R
from foxhunt_core.gpu.launch import get_kernel
from foxhunt_core.gpu.philox import boltzmann_uniforms

pytestmark = pytest.mark.gpu
KAT = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_device_philox_known_answers(cp, ctr, key, expected):
    out = cp.zeros(4, cp.uint32)
    fn = get_kernel("boltzmann.cu", "philox4x32_10_kat")
    fn((1,), (1,), (cp.asarray(ctr, cp.uint32), cp.asarray(key, cp.uint32), out))
    assert out.get().tolist() == expected


def _near_tie(values, offsets, temps, u, tol=1e-5):
    """[B, D] True where u lies within tol of a CDF boundary of the float64 softmax."""
    out = []
    for d in range(len(offsets) - 1):
        v = values[:, offsets[d] : offsets[d + 1]] / temps[d]
        p = np.exp(v - v.max(axis=1, keepdims=True))
        cdf = np.cumsum(p, axis=1) / p.sum(axis=1, keepdims=True)
        out.append((np.abs(cdf - u[:, d : d + 1]) < tol).any(axis=1))
    return np.stack(out, axis=1)


def _check(actions, values, offsets, temps, seed, counter):
    ref = R.boltzmann_select(values, offsets, temps, seed, counter)
    got = actions.get().astype(np.int64)
    u = boltzmann_uniforms(seed, counter, values.shape[0], len(offsets) - 1)
    differ = got != ref
    assert not (differ & ~_near_tie(values, offsets, temps, u)).any(), "actions differ away from CDF ties"
    assert differ.mean() < 1e-3


@pytest.mark.parametrize("offsets", [(0, 3, 6, 9, 12), (0, 2, 4, 6, 8, 10, 12), (0, 5, 7)])
def test_boltzmann_select_matches_numpy(cp, rng, offsets):
    B, D = 4099, len(offsets) - 1
    values = rng.normal(0, 2.0, (B, offsets[-1])).astype(np.float32)
    temps = rng.uniform(0.1, 3.0, D).astype(np.float32)
    seed, counter = int(rng.integers(0, 2**63)) * 2 + 1, int(rng.integers(0, 2**63)) * 2
    actions = cp.full((B, D), -1, cp.int32)
    K.boltzmann_select(to_dev(cp, values), offsets, to_dev(cp, temps), seed, counter, actions=actions)
    _check(actions, host64(values), offsets, host64(temps), seed, counter)
    for d in range(D):  # every action of every branch is drawn at these temperatures
        assert set(np.unique(actions.get()[:, d])) == set(range(offsets[d + 1] - offsets[d]))


def test_boltzmann_device_counter_advances_in_a_cuda_graph(cp, rng):
    B, offsets = 2048, (0, 3, 6, 9, 12)
    values = rng.normal(0, 1.0, (B, 12)).astype(np.float32)
    temps = np.array([0.5, 1.0, 2.0, 0.7], np.float32)
    seed, start = 12345, 2**40 + 7
    counter = cp.asarray([start], cp.uint64)
    v_d, t_d = to_dev(cp, values), to_dev(cp, temps)
    actions = cp.zeros((B, 4), cp.int32)
    K.boltzmann_select(v_d, offsets, t_d, seed, counter, actions=actions)  # warm-up: compiles
    _check(actions, host64(values), offsets, host64(temps), seed, start)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        K.boltzmann_select(v_d, offsets, t_d, seed, counter, actions=actions)
        graph = stream.end_capture()
        for i in range(3):
            graph.launch(stream)
            stream.synchronize()
            _check(actions, host64(values), offsets, host64(temps), seed, start + 1 + i)
    assert int(counter.get()[0]) == start + 4


def test_boltzmann_low_temperature_is_greedy(cp, rng):
    B, offsets = 512, (0, 3, 6, 9, 12)
    # Each branch holds a shuffled 0, 1, 2 (plus a per-sample shift): gaps of 1 / T = 100
    # make every other action's probability underflow (near-ties would make a draw legitimate).
    levels = np.tile(np.arange(3, dtype=np.float32), (B, 4))
    values = np.concatenate([rng.permuted(levels[:, 3 * d : 3 * d + 3], axis=1) for d in range(4)], axis=1)
    values = (values + rng.normal(0, 5.0, (B, 1))).astype(np.float32)
    temps = cp.full(4, 1e-2, cp.float32)
    actions = K.boltzmann_select(to_dev(cp, values), offsets, temps, 1, 0).get()
    greedy = np.stack([values[:, a:b].argmax(axis=1) for a, b in zip(offsets[:-1], offsets[1:])], axis=1)
    assert np.array_equal(actions, greedy)
