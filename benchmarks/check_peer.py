"""Check that the PyTorch peer computes what foxhunt computes (so the benchmark compares equal work).

Loads foxhunt's parameters into the peer, runs both on the same batch in float64 and compares
the loss and every parameter gradient (foxhunt's hand-written backward against autograd).

    python benchmarks/check_peer.py [--batch 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from torch_peer import PeerNet, loss_fn  # noqa: E402

from foxhunt_core.agent import Agent  # noqa: E402
from foxhunt_core.config import NetSettings, RunSettings  # noqa: E402
from foxhunt_core.plugins import PluginSet  # noqa: E402


def peer_names(sizes: int, adv_h: int) -> dict[str, tuple[str, bool, slice | None]]:
    """foxhunt core parameter name -> (peer parameter name, transposed, the peer rows it fills)."""
    m = {"trunk.w1": ("fc1.weight", True), "trunk.b1": ("fc1.bias", False),
         "trunk.w2": ("fc2.weight", True), "trunk.b2": ("fc2.bias", False),
         "vsn.w": ("vsn.weight", True), "vsn.b": ("vsn.bias", False),
         "value.w": ("value.weight", True), "value.b": ("value.bias", False),
         "attn.emb": ("emb", False), "attn.wq": ("wq", False), "attn.wk": ("wk", False),
         "attn.gate": ("agate", False)}
    m = {k: v + (None,) for k, v in m.items()}
    gate, val = slice(0, adv_h), slice(adv_h, 2 * adv_h)  # the peer's joint GLU Linear: [gate; value]
    for d in range(sizes):
        for ours, theirs, rows in (("w_gate", "glu", gate), ("w_val", "glu", val), ("w_out", "out", None)):
            m[f"branch{d}.{ours}"] = (f"{theirs}.{d}.weight", True, rows)
            m[f"branch{d}.b{ours[1:]}"] = (f"{theirs}.{d}.bias", False, rows)
    return m


def load_into(peer: PeerNet, core: dict[str, np.ndarray], names) -> None:
    params = dict(peer.named_parameters())
    with torch.no_grad():
        for ours, (theirs, transpose, rows) in names.items():
            v = torch.from_numpy(np.asarray(core[ours], dtype=np.float64))
            dst = params[theirs] if rows is None else params[theirs][rows]
            dst.copy_(v.T if transpose else v)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    net = NetSettings(shared_h1=32, shared_h2=32, adv_h=24, num_atoms=51)
    settings = RunSettings(net=net)
    rng = np.random.default_rng(0)
    agent = Agent(settings, PluginSet(), np, rng, dtype=np.float64)
    agent.online["core"]["attn.gate"][:] = rng.normal(size=12) * 0.5
    for k in agent.online["core"]:
        if k.endswith("w_out") or k == "value.w":
            agent.online["core"][k] *= 8
    agent.sync_target()
    agent.target["core"]["value.b"] += 0.2
    B = args.batch
    batch = {"obs": rng.normal(size=(B, 50)), "next_obs": rng.normal(size=(B, 50)),
             "action": rng.integers(0, 3, size=(B, 4)), "reward": rng.normal(size=B),
             "terminal": (rng.random(B) < 0.2).astype(np.float64)}
    t = settings.train
    grads, scalars, _, _ = agent.loss_and_grads(batch, t.entropy_coeff)
    ours = float(scalars["loss"] + scalars["aux_loss"])

    kw = dict(h1=net.shared_h1, h2=net.shared_h2, adv_h=net.adv_h, num_atoms=net.num_atoms,
              attn_dim=net.attn_dim, v_min=net.v_min, v_max=net.v_max, dtype=torch.float64)
    online, target = PeerNet(**kw).double(), PeerNet(**kw).double()
    names = peer_names(4, net.adv_h)
    load_into(online, agent.online["core"], names)
    load_into(target, agent.target["core"], names)
    tb = tuple(torch.from_numpy(np.asarray(batch[k])) for k in ("obs", "next_obs", "action", "reward", "terminal"))
    loss = loss_fn(online, target, tb, gamma=t.gamma, beta=t.entropy_coeff, aux_w=t.aux_weight)
    loss.backward()
    theirs = float(loss.detach())
    worst = 0.0
    params = dict(online.named_parameters())
    for k, (pn, transpose, rows) in names.items():
        g = params[pn].grad.numpy()
        g = g if rows is None else g[rows]
        g = g.T if transpose else g
        err = np.abs(g - grads["core"][k]).max() / max(np.abs(g).max(), 1e-12)
        worst = max(worst, err)
        if err > 1e-8:
            print(f"gradient mismatch {k}: relative {err:.3g}")
    print(f"loss foxhunt {ours:.12f} torch {theirs:.12f}; worst relative gradient difference {worst:.3g}")
    return 0 if abs(ours - theirs) < 1e-9 and worst < 1e-8 else 1


if __name__ == "__main__":
    raise SystemExit(main())
