"""CUDA kernel parity and its place in the captured collection step (``gpu``: skipped without a GPU).

Parity: fresh random distributions each run (the seed is printed on failure), the output poisoned
with NaN before the launch, the float64 NumPy twin as reference, ``||out - ref|| / ||ref|| < 1e-6``.
The kernel sums the CDF in double (as the twin does, in the same order) and rounds once to float32,
so what is left is that rounding (~6e-8 relative).
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
TOL = 1e-6


def _fresh(batch: int, actions: int, atoms: int, scale: float) -> tuple[np.ndarray, int]:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(batch, actions, atoms)) * scale
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)).astype(np.float32), seed


def _twin(probs: np.ndarray, z: np.ndarray, alpha: float, lower: float, upper: float) -> np.ndarray:
    from foxhunt_quantile_select.quantile import quantile_select_xp

    return quantile_select_xp(np, probs.astype(np.float64), z.astype(np.float64), alpha, lower, upper)


def _rel(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


@pytest.mark.parametrize(("batch", "atoms", "scale"), [(1, 51, 1.0), (7, 51, 3.0), (129, 11, 0.5), (4096, 51, 8.0),
                                                       (65_536, 51, 2.0), (1000, 64, 4.0), (300, 101, 3.0)])
@pytest.mark.parametrize("readiness", [0.0, 0.37, 1.0, -0.5, 1.5])
@pytest.mark.parametrize("on_device", [True, False])
def test_kernel_matches_float64_twin(batch, atoms, scale, readiness, on_device):
    import cupy
    from foxhunt_quantile_select.kernel import quantile_select_cuda

    probs, seed = _fresh(batch, 12, atoms, scale)
    z = np.linspace(-10.0, 10.0, atoms).astype(np.float32)
    lower, upper = (0.1, 0.9) if batch % 2 else (0.05, 0.7)
    dp = cupy.asarray(probs)
    out = cupy.full((batch, 12), cupy.nan, dtype=cupy.float32)  # an element not written stays NaN
    r = cupy.asarray(np.float32(readiness)) if on_device else readiness
    res = quantile_select_cuda(dp, cupy.asarray(z), r, lower, upper, out=out)
    assert res is out
    got = cupy.asnumpy(out)
    assert np.isfinite(got).all(), f"unwritten elements (seed {seed})"
    err = _rel(got, _twin(probs, z, readiness, lower, upper))
    assert err < TOL, f"relative error {err:.3g} (seed {seed}, batch {batch}, atoms {atoms}, scale {scale})"
    assert np.array_equal(cupy.asnumpy(dp), probs), "input modified"


def test_stage_paths_agree_and_an_off_centre_support_is_read():
    import cupy
    from foxhunt_quantile_select.plugin import QuantileSelectStage

    from foxhunt_core.stages import SelectInputs

    probs, seed = _fresh(3000, 12, 51, 2.0)
    z = np.linspace(-2.0, 8.0, 51).astype(np.float32)
    dp, dz = cupy.asarray(probs), cupy.asarray(z)
    r = cupy.asarray(np.float32(0.6))
    inputs = SelectInputs(dp, dz, None, None, r)
    kernel = QuantileSelectStage().select_values(cupy, inputs)
    plain = QuantileSelectStage(use_cuda_kernel=False).select_values(cupy, inputs)
    ref = _twin(probs, z, 0.6, 0.1, 0.9)
    assert _rel(cupy.asnumpy(kernel), ref) < TOL, f"seed {seed}"
    assert _rel(cupy.asnumpy(plain), ref) < TOL, f"seed {seed}"


def test_readiness_is_read_on_the_device_when_a_captured_graph_replays():
    import cupy
    from foxhunt_quantile_select.kernel import quantile_select_cuda

    probs, seed = _fresh(2048, 12, 51, 2.0)
    z = np.linspace(-10.0, 10.0, 51).astype(np.float32)
    dp, dz = cupy.asarray(probs), cupy.asarray(z)
    readiness = cupy.zeros((), dtype=cupy.float32)
    out = cupy.full((2048, 12), cupy.nan, dtype=cupy.float32)
    quantile_select_cuda(dp, dz, readiness, 0.1, 0.9, out=out)  # compile outside the capture
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        quantile_select_cuda(dp, dz, readiness, 0.1, 0.9, out=out)
        graph = stream.end_capture()
    for value in (0.0, 0.25, 1.0, 0.8):
        with stream:  # the writes on the stream the graph replays on
            readiness.fill(value)
            out.fill(cupy.nan)
            graph.launch(stream)
        stream.synchronize()
        assert _rel(cupy.asnumpy(out), _twin(probs, z, value, 0.1, 0.9)) < TOL, f"readiness {value} (seed {seed})"


def _settings(episodes: int):
    from foxhunt_core.config import RunSettings

    return RunSettings.model_validate({
        "seed": 2, "device": "cuda", "market": {"bars": 4000}, "env": {"num_envs": episodes, "episode_len": 64},
        "train": {"batch_size": 64, "warmup_steps": 256, "replay_capacity": 8192},
    })


def _agent(options: dict | None = None):
    import cupy

    from foxhunt_core import backend
    from foxhunt_core.agent import Agent
    from foxhunt_core.plugins import discover

    settings = _settings(512)
    backend.select("cuda", settings.train.tf32)
    plugins = discover().plugin_set(["q_mean_center", "atom_entropy", "quantile_select"])
    agent = Agent(settings, plugins, cupy, np.random.default_rng(0), options=options)
    return agent, settings


def test_agent_collection_values_come_from_the_forwards_probabilities_inside_a_captured_graph():
    """act_values captured once: each replay reads the readiness then on the device; the values
    are the twin of the forward's own atom probabilities; evaluation uses coordinated Q."""
    import cupy

    agent, _ = _agent()
    obs = cupy.asarray(np.random.default_rng(1).normal(size=(512, 50)).astype(np.float32))
    readiness = cupy.zeros((), dtype=cupy.float32)
    out = agent.fused_network.forward(agent.online, obs, outputs=("probs", "q", "var"))
    probs, z = cupy.asnumpy(out.probs), cupy.asnumpy(agent.z)
    values = agent.act_values(obs, readiness)  # eager: compiles, loads and allocates outside the capture
    cupy.cuda.get_current_stream().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()
    with stream, cupy.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        values = agent.act_values(obs, readiness)
        graph = stream.end_capture()
    for value in (0.0, 1.0, 0.5):
        with stream:
            readiness.fill(value)
            values.fill(cupy.nan)
            graph.launch(stream)
        stream.synchronize()
        err = _rel(cupy.asnumpy(values), _twin(probs, z, value, 0.1, 0.9))
        assert err < 1e-5, f"readiness {value}: {err:.3g}"  # (two forwards: TF32 GEMMs, same inputs)
    q = agent.qpipe.forward(agent.online, out.probs, agent.z, q_raw=out.q, q_var=out.var)
    ev = agent.act_values(obs, 1.0, evaluation=True)
    assert _rel(cupy.asnumpy(ev), cupy.asnumpy(q.q_coord).astype(np.float64)) < 1e-5


def test_device_collector_captures_and_replays_with_quantile_select():
    import cupy

    from foxhunt_core.collector import DeviceCollector
    from foxhunt_core.market.splits import synthetic_splits

    agent, settings = _agent()
    split = synthetic_splits(settings.market).train
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # as the trainer runs it: every launch and write on the collector's stream
        col = DeviceCollector(agent, split, settings, seed=5)
        col.stream = stream
        col.collect(random=True)
        for readiness in (0.0, 0.5, 1.0):
            col.set_exploration(np.ones(agent.num_branches), readiness)
            for _ in range(3):
                col.collect()
    stream.synchronize()
    assert col.graph is not None and col.env_steps == 10 * 512
    col.env.check()
    assert bool(cupy.isfinite(col.env.obs).all()) and len(col.replay) > 0


def test_training_run_on_the_gpu_with_the_stage_3_flags():
    """The stage-3 plugin set trains on the GPU (captured collection and update graphs) and
    evaluates on coordinated Q."""
    import cupy

    from foxhunt_core.plugins import discover
    from foxhunt_core.qpipe import branch_argmax
    from foxhunt_core.trainer import Trainer

    settings = _settings(256).model_copy(update={"train": _settings(256).train.model_copy(
        update={"steps": 60, "stats_every": 20})})
    tr = Trainer(settings, discover().plugin_set(["q_mean_center", "atom_entropy", "quantile_select"]), None)
    assert tr.device == "cuda" and tr.agent.stage_owners["action_select"] == ["quantile_select"]
    tr.train()
    assert len(tr.history) == 3 and all(np.isfinite(r["loss"]) for r in tr.history)
    obs = np.random.default_rng(3).normal(size=(64, 50)).astype(np.float32)
    out = tr.agent.fused_network.forward(tr.agent.online, cupy.asarray(obs), outputs=("q",))
    q = tr.agent.qpipe.forward(tr.agent.online, None, tr.agent.z, q_raw=out.q)
    np.testing.assert_array_equal(tr.policy()(obs), cupy.asnumpy(branch_argmax(q.q_coord, tr.agent.offsets)))


def test_launch_wrapper_checks_arguments():
    import cupy
    from foxhunt_quantile_select.kernel import quantile_select_cuda

    z = cupy.linspace(-1, 1, 5, dtype=cupy.float32)
    p = cupy.full((4, 12, 5), 0.2, dtype=cupy.float32)
    with pytest.raises(TypeError, match="quantile_select: probs must be float32"):
        quantile_select_cuda(p.astype(cupy.float64), z, 0.5, 0.1, 0.9)
    with pytest.raises(ValueError, match="C-contiguous"):
        quantile_select_cuda(cupy.full((5, 12, 4), 0.2, dtype=cupy.float32).transpose(2, 1, 0), z, 0.5, 0.1, 0.9)
    with pytest.raises(ValueError, match="support has shape"):
        quantile_select_cuda(p, z[:4], 0.5, 0.1, 0.9)
    with pytest.raises(ValueError, match="quantile levels"):
        quantile_select_cuda(p, z, 0.5, 0.9, 0.1)
    with pytest.raises(ValueError, match="iqn_readiness has shape"):
        quantile_select_cuda(p, z, cupy.zeros(1, dtype=cupy.float32), 0.1, 0.9)
    with pytest.raises(ValueError, match="out has shape"):
        quantile_select_cuda(p, z, 0.5, 0.1, 0.9, out=cupy.empty((4, 11), dtype=cupy.float32))
    with pytest.raises(TypeError, match="CuPy array"):
        quantile_select_cuda(np.zeros((4, 12, 5), dtype=np.float32), z, 0.5, 0.1, 0.9)
