"""Warm start: a new run that begins from another run's parameters (``foxhunt train --init-from``).

This is how a rollout stage rolls a component into a live agent (``init_from: good`` in a plan):
the trial for seed ``s`` starts from the last promoted stage's final checkpoint for seed ``s``.

* Every parameter tensor of the checkpoint's online network that the new network also has, with
  the same shape, is copied: the core's and those of the plugins both runs enable.
* A newly enabled plugin's parameters stay at their init (its ``init_params``).
* A branch-input plugin widens its branches' GLU input (``u_d = [z, cond_d, extra_d]``); the rows
  reading ``extra_d`` are ``branch<d>.w_gate_in`` / ``w_val_in``. Where the checkpoint has them
  for fewer columns, the rows that read the checkpoint's columns are copied and the rows that read
  the new plugin's columns are set to **zero**; where it has none, they are all set to zero. So
  at step 0 the new columns change nothing.
* The target network starts equal to the online one (as at any run's start); the optimizer, the
  replay buffer, the exploration schedule and the step counter start afresh: the run trains its
  own ``train.steps`` updates.

A plugin whose init leaves the network's function unchanged declares ``starts_as_identity`` in
its manifest (post-attention stages that start as the identity, branch-input columns, plugins
that change only the loss or the exploration). When every newly enabled plugin declares it, the
warm-started run's coordinated Q at step 0 equals the checkpoint's (``function_preserved``); the
record says which plugins do not. The record is written to ``warm_start.json`` in the run
directory.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import CheckpointError, atomic_write_text, load_checkpoint, unflatten
from .net.network import split_widened_rows

RECORD = "warm_start.json"
WIDENED = ("w_gate_in", "w_val_in")


def identity_declarations(plugins: Any) -> dict[str, bool]:
    """``starts_as_identity`` of each plugin of a :class:`~foxhunt_core.plugins.PluginSet`
    (``False`` for a plugin registered without a manifest)."""
    return {p.name: bool(getattr(p.manifest, "starts_as_identity", False)) for p in plugins.plugins}


def branch_rows(net: Any, d: int, keep: set[str]) -> np.ndarray:
    """Row indices of branch ``d``'s ``w_gate_in`` / ``w_val_in`` (one row per extra input column)
    that an older network, whose branch-input plugins were ``keep``, also had (in its order)."""
    rows: list[int] = []
    at = 0
    for st in net.branch_inputs:
        if d not in st.branches:
            continue
        if st.name in keep:
            rows += range(at, at + st.width)
        at += st.width
    return np.asarray(rows, dtype=np.int64)


def _digest(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


def transfer(agent: Any, saved: dict[str, dict[str, np.ndarray]], old_plugins: list[str],
             source: str = "<checkpoint>") -> dict[str, Any]:
    """Copy ``saved`` (an online parameter tree) into ``agent.online`` as the module docstring
    says, then sync the target network; returns what was copied, widened and left at init."""
    xp, net = agent.xp, agent.net
    keep = set(old_plugins)
    copied: dict[str, np.ndarray] = {}
    widened, at_init = [], []
    for owner, sub in agent.online.items():
        for name, dst in sub.items():
            key = f"{owner}/{name}"
            src = saved.get(owner, {}).get(name)
            part = name.split(".", 1)
            d = int(part[0][len("branch"):]) if owner == "core" and part[0].startswith("branch") else None
            rows_in = d is not None and part[1] in WIDENED  # rows reading branch-input columns
            if src is None and rows_in:  # the branch had no extra columns: all of them are new
                dst[...] = 0.0
                widened.append(key)
                continue
            if src is None:
                at_init.append(key)
                continue
            shape = tuple(dst.shape)
            if tuple(src.shape) == shape:
                dst[...] = xp.asarray(src, dtype=dst.dtype)
                copied[key] = np.asarray(src)
                continue
            if rows_in:
                rows = branch_rows(net, d, keep)
                if src.shape == (rows.size, shape[1]):
                    full = np.zeros(shape, dtype=np.asarray(src).dtype)
                    full[rows] = src
                    dst[...] = xp.asarray(full, dtype=dst.dtype)
                    copied[key] = np.asarray(src)
                    widened.append(key)
                    continue
            raise CheckpointError(f"{source}: tensor online/{key} has shape {tuple(src.shape)}, this network's is "
                                  f"{shape} (warm start needs the same network sizes)")
    dropped = sorted(f"{o}/{k}" for o, sub in saved.items() for k in sub
                     if o not in agent.online or k not in agent.online[o])
    agent.sync_target()
    return {"transferred": len(copied), "widened": widened, "at_init": at_init, "dropped": dropped,
            "params_sha256": _digest(copied)}


def warm_start(trainer: Any, checkpoint: Path) -> dict[str, Any]:
    """Start ``trainer`` (a fresh :class:`~foxhunt_core.trainer.Trainer`, step 0) from the online
    parameters of ``checkpoint``; writes and returns the warm-start record."""
    if trainer.step != 0:
        raise CheckpointError(f"{checkpoint}: a warm start begins a new run (this one is at update {trainer.step})")
    tensors, meta = load_checkpoint(checkpoint)
    tensors = split_widened_rows(tensors, trainer.agent.net)
    old = list(meta.get("plugins", []))
    rec = transfer(trainer.agent, unflatten("online", tensors), old, str(checkpoint))
    ident = identity_declarations(trainer.plugins)
    new = [n for n in trainer.plugins.names if n not in old]
    removed = [n for n in old if n not in trainer.plugins.names]
    record = {"source": str(checkpoint), "from_plugins": old, "from_step": int(meta.get("step", 0)),
              "new_plugins": new, "removed_plugins": removed,
              "starts_as_identity": {n: ident[n] for n in new},
              "function_preserved": not removed and all(ident[n] for n in new), **rec}
    if trainer.out_dir is not None:
        atomic_write_text(trainer.out_dir / RECORD, json.dumps(record, indent=1))
    trainer.log.event("warm_start", **{k: v for k, v in record.items() if k not in ("widened", "at_init", "dropped")})
    return record
