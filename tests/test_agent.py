"""The whole update: C51 + entropy + auxiliary coordinated-Q loss, checked by finite differences."""

import numpy as np
import pytest

from foxhunt_core.agent import Agent
from foxhunt_core.config import NetSettings, RunSettings, TrainSettings
from foxhunt_core.plugins import LoadedPlugin, PluginSet
from foxhunt_core.testing import check_tree_gradients
from hook_plugins import AffinePostPlugin, CenterPlugin, OfiColumnPlugin, TanhGatePlugin


def _settings(**train):
    net = NetSettings(shared_h1=12, shared_h2=10, adv_h=8, num_atoms=7, v_min=-2.0, v_max=2.0)
    return RunSettings(net=net, train=TrainSettings(**train))


def _batch(rng, B=6):
    return {
        "obs": rng.normal(size=(B, 50)),
        "next_obs": rng.normal(size=(B, 50)),
        "action": rng.integers(0, 3, size=(B, 4)),
        "reward": rng.normal(size=B) * 0.5,
        "terminal": (rng.random(B) < 0.3).astype(np.float64),
    }


def _plugins(names):
    table = {"center": CenterPlugin, "affine_post": AffinePostPlugin,
             "tanh_gate": TanhGatePlugin, "ofi_column": OfiColumnPlugin}
    return PluginSet([LoadedPlugin(n, table[n].POSITION, table[n]()) for n in names])


@pytest.mark.parametrize(
    "names", [[], ["center", "affine_post", "tanh_gate", "ofi_column"]], ids=["core", "with-stages"]
)
def test_full_objective_gradient(names):
    rng = np.random.default_rng(21)
    agent = Agent(_settings(entropy_coeff=0.05, aux_weight=0.7), _plugins(names), np, rng, dtype=np.float64)
    for k in agent.online["core"]:
        if k.endswith("w_out") or k == "value.w":
            agent.online["core"][k] *= 10
    agent.online["core"]["attn.gate"][:] = rng.normal(size=12) * 0.5
    if "affine_post" in agent.online:
        agent.online["affine_post"]["a"][:] = rng.normal(size=12) * 0.3
        agent.online["affine_post"]["b"][:] = rng.normal(size=12) * 0.3
        agent.online["affine_post"]["c"][:] = rng.normal(size=12) * 0.3
    agent.sync_target()
    agent.target["core"]["value.b"] += 0.3  # target differs from online
    batch = _batch(rng)

    def objective(with_aux):
        def f():
            _, s, _, _ = agent.loss_and_grads(batch, 0.05)
            return float(s["loss"] + (s["aux_loss"] if with_aux else 0.0))

        return f

    grads, _, _, _ = agent.loss_and_grads(batch, 0.05)
    assert set(grads) == set(agent.online)
    # The auxiliary loss stops at the raw Q: network parameters are checked against the C51
    # loss alone, attention and post-attention parameters against the whole objective.
    q_side = {"core": {k: v for k, v in agent.online["core"].items() if k.startswith("attn.")}}
    if "affine_post" in agent.online:
        q_side["affine_post"] = agent.online["affine_post"]
    net_side = {o: {k: v for k, v in s.items() if k not in q_side.get(o, {})}
                for o, s in agent.online.items() if o != "affine_post"}
    fails = check_tree_gradients(objective(False), net_side, grads, rng, samples_per_tensor=6, rtol=1e-4)
    fails += check_tree_gradients(objective(True), q_side, grads, rng, samples_per_tensor=6, rtol=1e-4)
    assert fails == []
    assert np.abs(grads["core"]["attn.gate"]).max() > 0

def test_update_trains_plugin_parameters_and_target_sync():
    rng = np.random.default_rng(4)
    agent = Agent(_settings(lr=1e-2), _plugins(["affine_post", "tanh_gate", "ofi_column"]), np, rng)
    before = {o: {k: v.copy() for k, v in s.items()} for o, s in agent.online.items()}
    for _ in range(3):
        batch = {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in _batch(rng, 16).items()}
        agent.update(batch, 0.01)
    for owner in ("affine_post", "tanh_gate", "ofi_column"):
        moved = any(not np.array_equal(before[owner][k], v) for k, v in agent.online[owner].items())
        assert moved, f"{owner} parameters were not updated"
        assert np.array_equal(before[owner]["a" if owner == "affine_post" else next(iter(before[owner]))],
                              agent.target[owner]["a" if owner == "affine_post" else next(iter(before[owner]))])
    agent.sync_target()
    for o, s in agent.online.items():
        for k, v in s.items():
            assert np.array_equal(agent.target[o][k], v)


def test_stages_are_ordered_by_rollout_position():
    # registered in reverse order; the core orders by POSITION
    ps = _plugins(["ofi_column", "tanh_gate", "affine_post", "center"])
    assert ps.names == ["center", "affine_post", "tanh_gate", "ofi_column"]


def test_float32_update_stays_float32():
    """No float64 scalar may promote the float32 training path (it would also break GPU GEMMs)."""
    rng = np.random.default_rng(9)
    agent = Agent(_settings(), _plugins(["center", "affine_post", "tanh_gate", "ofi_column"]), np, rng)
    batch = {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in _batch(rng, 8).items()}
    grads, scalars, out, q = agent.loss_and_grads(batch, 0.01)
    for o, sub in grads.items():
        for k, g in sub.items():
            assert g.dtype == np.float32, f"{o}/{k} is {g.dtype}"
    assert out.probs.dtype == np.float32 and q.q_coord.dtype == np.float32
