"""GpuReplay (kernels/replay.cu) against the NumPy ReplayBuffer: add, sample, checkpoints.

Fresh random transitions each run; batch outputs are poisoned with NaN (or -1) before each
launch. Everything is a copy, so every comparison is exact.
"""

import numpy as np
import pytest

from foxhunt_core.gpu.replay import STREAM_SAMPLE, GpuReplay, sample_indices
from foxhunt_core.replay import FIELDS, ReplayBuffer

D, B = 50, 4


def _batch(rng, n, action_dtype=np.int64, terminal_dtype=np.float32):
    return (rng.normal(size=(n, D)).astype(np.float32), rng.integers(0, 3, size=(n, B)).astype(action_dtype),
            rng.normal(size=n).astype(np.float32), rng.normal(size=(n, D)).astype(np.float32),
            (rng.random(n) < 0.3).astype(terminal_dtype))


def _assert_same(gpu, ref):
    assert (gpu.pos, gpu.size) == (ref.pos, ref.size)
    for f in FIELDS:
        np.testing.assert_array_equal(getattr(gpu, f).get(), getattr(ref, f), err_msg=f)


# ---------------------------------------------------------------------------- CPU: host twin
def test_sample_indices_are_uniform_over_the_filled_part():
    idx = sample_indices(11, 0, 200_000, 37)
    assert idx.dtype == np.int64 and idx.min() == 0 and idx.max() == 36
    counts = np.bincount(idx, minlength=37)
    assert counts.min() > 0.9 * 200_000 / 37 and STREAM_SAMPLE not in (0, 1)
    assert (sample_indices(11, 0, 8, 0) == 0).all()  # empty buffer: row 0


# ---------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("action_dtype,terminal_dtype", [(np.int64, np.float32), (np.int32, np.bool_)])
def test_add_matches_numpy_buffer_across_wrap_around(cp, rng, action_dtype, terminal_dtype):
    cap = int(rng.integers(300, 700))
    gpu, ref = GpuReplay(cap, D, B, seed=1), ReplayBuffer(cap, D, B)
    for _ in range(8):  # sizes that wrap the ring several times, partial and whole
        n = int(rng.integers(1, cap + 1))
        batch = _batch(rng, n, action_dtype, terminal_dtype)
        gpu.add(*(cp.asarray(x) for x in batch))
        ref.add(*batch)
        _assert_same(gpu, ref)


@pytest.mark.gpu
def test_sample_gathers_the_rows_of_its_indices(cp, rng):
    cap, batch = 1000, 777
    gpu, ref = GpuReplay(cap, D, B, seed=2), ReplayBuffer(cap, D, B)
    data = _batch(rng, 640)
    gpu.add(*(cp.asarray(x) for x in data))
    ref.add(*data)
    for explicit in (True, False):
        counter = int(gpu.counter.get()[0])
        idx = rng.integers(0, 640, batch) if explicit else sample_indices(2, counter, batch, 640)
        out = gpu.batch_buffers(batch)
        for f in FIELDS:
            out[f].fill(-1 if out[f].dtype == cp.int64 else np.nan)
        out["index"].fill(-1)
        got = gpu.sample(batch, indices=cp.asarray(idx) if explicit else None)
        np.testing.assert_array_equal(got["index"].get(), idx)
        for f in FIELDS:
            np.testing.assert_array_equal(got[f].get(), getattr(ref, f)[idx], err_msg=f)
    assert int(gpu.counter.get()[0]) == 2


@pytest.mark.gpu
def test_checkpoints_are_interchangeable_with_the_numpy_buffer(cp, rng):
    cap = 500
    gpu, ref = GpuReplay(cap, D, B, seed=3), ReplayBuffer(cap, D, B)
    for n in (300, 350):
        data = _batch(rng, n)
        gpu.add(*(cp.asarray(x) for x in data))
        ref.add(*data)
    gpu.sample(64)
    state = gpu.state_dict()
    other = ReplayBuffer(cap, D, B)
    other.load_state_dict(state["arrays"], state["meta"])
    _assert_same(gpu, other)
    clone = GpuReplay(cap, D, B, seed=99)
    clone.load_state_dict(state["arrays"], state["meta"])
    _assert_same(clone, other)
    assert clone.seed == 3 and int(clone.counter.get()[0]) == 1
    mine, theirs = clone.sample(32), gpu.sample(32)  # the next draws agree too
    for f in (*FIELDS, "index"):
        np.testing.assert_array_equal(mine[f].get(), theirs[f].get(), err_msg=f)
    fresh = GpuReplay(cap, D, B)
    cpu_state = ref.state_dict()
    fresh.load_state_dict(cpu_state["arrays"], cpu_state["meta"])
    _assert_same(fresh, ref)
    with pytest.raises(ValueError, match="capacity"):
        GpuReplay(cap + 1, D, B).load_state_dict(cpu_state["arrays"], cpu_state["meta"])


@pytest.mark.gpu
def test_add_and_sample_replay_from_a_captured_graph(cp, rng):
    cap, n, batch = 4096, 1000, 256
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # everything on one stream: a non-blocking one does not wait for the default
        gpu, ref = GpuReplay(cap, D, B, seed=4, batch_size=batch), ReplayBuffer(cap, D, B)
        inputs = [cp.asarray(x) for x in _batch(rng, n)]
        gpu.add(*inputs)  # compile outside the capture
        gpu.sample(batch)
        stream.synchronize()
        ref.add(*(x.get() for x in inputs))
        stream.begin_capture()
        gpu.add(*inputs)
        out = gpu.sample(batch)
        graph = stream.end_capture()
        for step in range(6):
            data = _batch(rng, n)
            for dst, src in zip(inputs, data, strict=True):
                dst.set(src)
            graph.launch(stream)
            stream.synchronize()
            ref.add(*data)
            _assert_same(gpu, ref)
            idx = sample_indices(4, 1 + step, batch, ref.size)
            np.testing.assert_array_equal(out["index"].get(), idx)
            np.testing.assert_array_equal(out["obs"].get(), ref.obs[idx])
