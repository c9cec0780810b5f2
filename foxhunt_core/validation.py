"""One validation of run settings, shared by ``flags validate``, ``train``, ``resume`` and rollouts.

The pydantic models (:mod:`foxhunt_core.config`, the plugins' option models) check each field
alone. This module adds what a run needs beyond that, so that a file that validates is a file
that runs and a file that would fail (or run into nonsense) is refused before anything is
written:

* **written types** (:func:`scalar_problems`): an integer field takes a YAML integer (not
  ``true``, ``"1"`` or ``1.5e3``), a number field a number, a switch ``true``/``false``;
  pydantic's lax mode would turn all of those into something;
* **finite numbers** (:func:`non_finite_problems`): no ``.inf``/``.nan`` anywhere;
* **bounds on every size and scale** (:data:`BOUNDS`), also where the schema has only a lower
  bound: widths, atoms, batch, replay, bars, environments, seeds (0 .. 2^63-1), the learning
  rate, ...; and no single array of more than 2^31-1 elements (the CUDA kernels' index range);
* **cross-field rules** (:func:`settings_problems`): ``state_dim`` is the feature schema's width;
  ``branch_sizes`` are the environment's actions (3 directions, one magnitude per
  ``position_sizes`` entry, 3 order types, one urgency per ``urgency_bars`` entry); Adam's betas
  in [0, 1); ``tau_min <= tau``; ``liquid_tau_min <= liquid_tau_max``; position sizes in (0, 1];
  urgency bars in 1 .. ``episode_len``; the tick below the start price and the start price at
  most 10^12 ticks (the market is simulated in ticks); the train, validation
  and test fractions leave a test block; the replay holds one collection step;
* **memory** (:func:`memory_estimate`): what the settings imply for the market, the replay
  buffer, the network with its optimizer state and the update's activations, against a limit:
  ``FOXHUNT_MEMORY_LIMIT`` (bytes, or with a K/M/G/T suffix, binary units; ``off`` for none),
  by default this machine's physical memory;
* **the data** (:func:`data_problems`, not part of :func:`settings_problems` because it builds
  the market): the market is simulated and its train block must hold an episode
  (``episode_len + 1`` bars), its test block (and a non-empty validation block) at least
  :data:`MIN_EVAL_BARS` bars.

Every problem is ``(location, message)`` with the location relative to the validated model;
:func:`lines` turns them into the ``file:line: path: message`` lines of flag files.
"""

from __future__ import annotations

import math
import os
import re
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from .config import RunSettings
from .market import schema

Loc = tuple[Any, ...]
Problem = tuple[Loc, str]

MEMORY_ENV = "FOXHUNT_MEMORY_LIMIT"
MIN_EVAL_BARS = 64
MAX_ELEMENTS = 2**31 - 1
MAX_SEED = 2**63 - 1
MAX_TICKS = 1e12

# (lowest, highest) accepted, inclusive, beyond the schema's own bounds; None: the schema's
BOUNDS: dict[Loc, tuple[float | None, float | None]] = {
    ("seed",): (0, MAX_SEED),
    ("market", "bars"): (None, 100_000_000),
    ("market", "seed"): (0, MAX_SEED),
    ("market", "tick_size"): (None, 1e6),
    ("market", "start_price"): (None, 1e9),
    ("market", "ofi_impact"): (None, 1e3),
    ("market", "noise_ticks"): (None, 1e3),
    ("env", "num_envs"): (None, 1_048_576),
    ("env", "episode_len"): (None, 10_000_000),
    ("env", "taker_fee_bps"): (None, 10_000),
    ("env", "maker_fee_bps"): (-10_000, 10_000),
    ("env", "reward_scale_bps"): (1e-6, 1e6),
    ("net", "shared_h1"): (None, 16_384),
    ("net", "shared_h2"): (None, 16_384),
    ("net", "adv_h"): (None, 16_384),
    ("net", "num_atoms"): (None, 1_024),
    ("net", "v_min"): (-1e6, 1e6),
    ("net", "v_max"): (-1e6, 1e6),
    ("net", "attn_dim"): (None, 1_024),
    ("net", "init_scale"): (None, 100),
    ("train", "steps"): (None, 10**10),
    ("train", "batch_size"): (None, 1_048_576),
    ("train", "lr"): (None, 1.0),
    ("train", "adam_eps"): (None, 1.0),
    ("train", "grad_clip"): (None, 1e9),
    ("train", "target_sync_every"): (None, 10**10),
    ("train", "entropy_coeff"): (None, 100),
    ("train", "aux_weight"): (None, 1e3),
    ("train", "replay_capacity"): (None, 10**9),
    ("train", "warmup_steps"): (None, 10**9),
    ("train", "collect_per_update"): (None, 1_000),
    ("train", "stats_every"): (None, 10**10),
    ("train", "tau"): (None, 1e6),
    ("train", "tau_min"): (None, 1e6),
    ("train", "liquid_dt"): (None, 1e3),
    ("train", "liquid_tau_min"): (None, 1e3),
    ("train", "liquid_tau_max"): (None, 1e3),
    ("train", "checkpoint_every"): (None, 10**10),
    ("train", "checkpoint_minutes"): (None, 10_080),
}


# ----------------------------------------------------------------------------- written types
def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if value is None:
        return "null"
    return type(value).__name__ if not isinstance(value, (dict, list)) else ("a mapping" if isinstance(
        value, dict) else "a list")


def _check(ann: Any, value: Any, loc: Loc) -> list[Problem]:
    origin, args = get_origin(ann), get_args(ann)
    if ann is Any or origin is Literal:
        return []
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return []
        inner = [a for a in args if a is not type(None)]
        return _check(inner[0], value, loc) if len(inner) == 1 else []
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return scalar_problems(ann, value, loc)
    if origin in (tuple, list) and isinstance(value, list):
        if origin is tuple and args and args[-1] is not Ellipsis:
            pairs = list(zip(args, value))
        else:
            pairs = [(args[0] if args else Any, v) for v in value]
        return [p for i, (a, v) in enumerate(pairs) for p in _check(a, v, loc + (i,))]
    if ann is bool and not isinstance(value, bool):
        return [(loc, f"expected true or false, got {_kind(value)}")]
    if ann is int and (isinstance(value, bool) or not isinstance(value, int)):
        return [(loc, f"expected an integer, got {_kind(value)}")]
    if ann is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return [(loc, f"expected a number, got {_kind(value)}")]
    return []


def scalar_problems(model: type[BaseModel], data: Any, loc: Loc = ()) -> list[Problem]:
    """Values of ``data`` (as read from YAML) whose type is not the field's own: pydantic would
    coerce ``true`` or ``"1"`` to 1, ``"yes"`` to true and ``1e3`` to 1000."""
    if not isinstance(data, dict):
        return []
    out: list[Problem] = []
    for key, value in data.items():
        field = model.model_fields.get(key) if isinstance(key, str) else None
        if field is not None:
            out += _check(field.annotation, value, loc + (key,))
    return out


def non_finite_problems(data: Any, loc: Loc = ()) -> list[Problem]:
    """Every ``.inf``/``.nan`` in ``data``: no setting of a run or a plan takes one."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in non_finite_problems(v, loc + (k,))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in non_finite_problems(v, loc + (i,))]
    if isinstance(data, float) and not math.isfinite(data):
        return [(loc, f"must be a finite number, not {data!r}")]
    return []


# ----------------------------------------------------------------------------- settings
def _get(s: BaseModel, loc: Loc) -> Any:
    v: Any = s
    for part in loc:
        v = getattr(v, part)
    return v


def _fmt(x: float) -> str:
    return f"{int(x):,}".replace(",", "_") if float(x).is_integer() and abs(x) >= 10_000 else f"{x:g}"


def bound_problems(s: RunSettings) -> list[Problem]:
    out = []
    for loc, (lo, hi) in BOUNDS.items():
        try:
            v = _get(s, loc)
        except AttributeError:  # a setting another version does not have
            continue
        if v is None:  # an optional setting left unset (e.g. env.reward_scale_bps: from the data)
            continue
        if isinstance(v, float) and not math.isfinite(v):
            continue  # refused as non-finite where it is written
        if lo is not None and v < lo:
            out.append((loc, f"must be at least {_fmt(lo)}"))
        elif hi is not None and v > hi:
            out.append((loc, f"must be at most {_fmt(hi)}"))
    return out


def _elements(s: RunSettings) -> list[tuple[Loc, int, str]]:
    n, t = s.net, s.train
    actions, atoms = sum(n.branch_sizes), n.num_atoms
    return [
        (("train", "batch_size"), t.batch_size * actions * atoms, f"batch_size x {actions} actions x num_atoms"),
        (("env", "num_envs"), s.env.num_envs * actions * atoms, f"num_envs x {actions} actions x num_atoms"),
        (("train", "replay_capacity"), t.replay_capacity * n.state_dim, "replay_capacity x state_dim"),
        (("market", "bars"), s.market.bars * n.state_dim, "bars x state_dim"),
        (("net", "shared_h1"), max(n.shared_h1 * n.shared_h2, n.adv_h * 3 * atoms), "the largest weight matrix"),
    ]


def settings_problems(s: RunSettings) -> list[Problem]:
    """Bounds, cross-field rules and the memory check for validated settings (module docstring).

    A rule that involves a setting already out of its bounds is not reported (it would only
    repeat that problem); the memory check runs once everything else holds."""
    out = bound_problems(s)
    bad = {loc for loc, _ in out}
    n, e, t, m = s.net, s.env, s.train, s.market

    def rule(loc: Loc, msg: str, *involves: Loc) -> None:
        if loc not in bad and not bad.intersection(involves):
            out.append((loc, msg))

    if n.state_dim != schema.STATE_DIM:
        rule(("net", "state_dim"), f"must be {schema.STATE_DIM}, the width of the feature schema "
                                   "(foxhunt_core.market.schema)")
    want = (3, len(e.position_sizes), 3, len(e.urgency_bars))
    if tuple(n.branch_sizes) != want:
        rule(("net", "branch_sizes"), f"must be {list(want)}: the environment's actions are 3 directions, one "
                                      "magnitude per env.position_sizes entry, 3 order types and one urgency per "
                                      "env.urgency_bars entry")
    for i, b in enumerate(t.adam_betas):
        if not 0 <= b < 1:
            rule(("train", "adam_betas", i), f"must be in [0, 1), not {b:g}")
    if t.tau_min > t.tau:
        rule(("train", "tau_min"), f"must not exceed tau ({t.tau_min:g} > {t.tau:g}): the temperature anneals "
                                   "from tau down to tau_min", ("train", "tau"))
    if t.liquid_tau_min > t.liquid_tau_max:
        rule(("train", "liquid_tau_min"), f"must not exceed liquid_tau_max ({t.liquid_tau_min:g} > "
                                          f"{t.liquid_tau_max:g})", ("train", "liquid_tau_max"))
    for i, p in enumerate(e.position_sizes):
        if not 0 < p <= 1:
            rule(("env", "position_sizes", i), f"must be in (0, 1] (a fraction of max notional), not {p:g}")
    for i, u in enumerate(e.urgency_bars):
        if not 1 <= u <= e.episode_len:
            rule(("env", "urgency_bars", i), f"must be between 1 and env.episode_len ({e.episode_len}), not {u}",
                 ("env", "episode_len"))
    if m.tick_size >= m.start_price:
        rule(("market", "tick_size"), f"must be below start_price ({m.tick_size:g} >= {m.start_price:g})",
             ("market", "start_price"))
    elif m.start_price / m.tick_size > MAX_TICKS:
        rule(("market", "tick_size"), f"start_price is {m.start_price / m.tick_size:.3g} ticks, more than "
                                      f"{MAX_TICKS:.0e} (the market is simulated in ticks; its features overflow)",
             ("market", "start_price"))
    if m.train_fraction + m.val_fraction >= 1:
        rule(("market", "val_fraction"), f"train_fraction + val_fraction = {m.train_fraction + m.val_fraction:g} "
                                         "leaves no test block (they must add up to less than 1)")
    if t.replay_capacity < e.num_envs * t.collect_per_update:
        rule(("train", "replay_capacity"), f"must hold one collection step (env.num_envs x "
                                           f"train.collect_per_update = {e.num_envs * t.collect_per_update})",
             ("env", "num_envs"), ("train", "collect_per_update"))
    if not bad:
        for loc, count, what in _elements(s):
            if count > MAX_ELEMENTS:
                rule(loc, f"{what} = {count:_} elements in one array, more than 2^31-1")
    if not out:
        out += memory_problems(s)
    return out


# ----------------------------------------------------------------------------- memory
def _gib(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2**10:.0f} KiB"


def memory_estimate(s: RunSettings) -> dict[str, tuple[Loc, int]]:
    """Bytes each part of a run takes (an estimate within a small factor), with the setting that
    sizes it: the market (bars, features, simulation temporaries and the scaled splits), the
    replay buffer, the parameters (online, target, Adam's moments, gradients and the fused
    layout's copies), the update's and the collection's activations."""
    n, e, t = s.net, s.env, s.train
    actions, atoms, branches = sum(n.branch_sizes), n.num_atoms, len(n.branch_sizes)
    branch_in = n.shared_h2 + n.branch_sizes[0] + 1
    params = (n.state_dim * n.shared_h1 + n.shared_h1 * n.shared_h2 + n.shared_h2 * n.shared_h2
              + n.shared_h2 * atoms + branches * 2 * branch_in * n.adv_h + n.adv_h * actions * atoms
              + 3 * actions * n.attn_dim + 4 * (n.shared_h1 + n.shared_h2 + atoms + n.adv_h))
    row = n.shared_h1 + 3 * n.shared_h2 + branches * 3 * n.adv_h + 4 * actions * atoms
    return {
        "market": (("market", "bars"), s.market.bars * 1024),
        "replay buffer": (("train", "replay_capacity"),
                          t.replay_capacity * (2 * n.state_dim * 4 + branches * 8 + 8)),
        "parameters": (("net", "shared_h1"), params * 4 * 8),
        "update": (("train", "batch_size"), t.batch_size * row * 4 * 6),
        "collection": (("env", "num_envs"), e.num_envs * (row * 4 * 2 + 512)),
    }


def memory_limit() -> tuple[int | None, str]:
    """The limit in bytes (None: no limit) and where it comes from; ValueError for a bad setting."""
    raw = os.environ.get(MEMORY_ENV, "").strip()
    if not raw:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None, "no limit (physical memory unknown)"
        return int(total), f"this machine's memory; {MEMORY_ENV} overrides it"
    if raw.lower() in ("off", "none", "0"):
        return None, f"{MEMORY_ENV}=off"
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?", raw, flags=re.IGNORECASE)
    if m is None:
        raise ValueError(f"{MEMORY_ENV}={raw!r}: write bytes, or a number with K, M, G or T (binary units), or off")
    scale = 1024 ** "KMGT".find(m.group(2).upper()) * 1024 if m.group(2) else 1
    return int(float(m.group(1)) * scale), f"{MEMORY_ENV}={raw}"


def memory_problems(s: RunSettings) -> list[Problem]:
    try:
        limit, source = memory_limit()
    except ValueError as exc:
        return [((), str(exc))]
    parts = memory_estimate(s)
    total = sum(b for _, b in parts.values())
    if limit is None or total <= limit:
        return []
    name, (loc, _) = max(parts.items(), key=lambda kv: kv[1][1])
    detail = ", ".join(f"{k} {_gib(b)}" for k, (_, b) in sorted(parts.items(), key=lambda kv: -kv[1][1])[:3])
    return [(loc, f"the run needs about {_gib(total)} of memory ({detail}), more than the limit of "
                  f"{_gib(limit)} ({source}); the {name} is the largest part")]


# ----------------------------------------------------------------------------- the data
def split_problem(n_bars: int, train_fraction: float, val_fraction: float, episode_len: int | None,
                  split: str | None = None) -> str | None:
    """Why ``n_bars`` bars split this way cannot be trained (``episode_len``) or evaluated on
    (``split``: that block; None: test and a non-empty validation block); None when they can."""
    n_train, n_val = int(n_bars * train_fraction), int(n_bars * val_fraction)
    blocks = {"train": n_train, "val": n_val, "test": n_bars - n_train - n_val}
    cut = f"{n_bars} bars split {train_fraction:g}/{val_fraction:g}/rest"
    if episode_len is not None and n_train < episode_len + 1:
        return (f"{cut} leave {n_train} bars for training; an episode of env.episode_len {episode_len} needs "
                f"{episode_len + 1}")
    wanted = [split] if split is not None else ["test"] + (["val"] if val_fraction > 0 else [])
    for name in wanted:
        if blocks[name] < MIN_EVAL_BARS:
            share = {"train": train_fraction, "val": val_fraction, "test": 1 - train_fraction - val_fraction}[name]
            need = math.ceil(MIN_EVAL_BARS / share) if share > 0 else None
            more = f" (at least {need} bars in all)" if need is not None else ""
            return (f"{cut} leave {blocks[name]} bars for the {name} split; evaluating needs at least "
                    f"{MIN_EVAL_BARS} there{more}")
    return None


def data_problems(s: RunSettings) -> list[Problem]:
    """Build the run's market and check that it can be split, trained on and evaluated."""
    from .market.source import load_market

    m = s.market
    try:
        bars = len(load_market(s).data)
    except ValueError as exc:  # DataError included: the file's own problem, named by the loader
        where = ("market", "path") if m.source == "file" else ("market",)
        return [(where, " ".join(str(exc).split()))]
    why = split_problem(bars, m.train_fraction, m.val_fraction, s.env.episode_len)
    if why is None:
        return []
    where = ("env", "episode_len") if "for training" in why else ("market", "train_fraction")
    return [(where, why)]


# ----------------------------------------------------------------------------- reporting
def lines(problems: list[Problem], path: str, line_of: Any, prefix: Loc = ()) -> list[str]:
    """``file:line: dotted.path: message`` lines; ``line_of(loc)`` gives a location's line."""
    out = []
    for loc, msg in problems:
        full = prefix + tuple(loc)
        where = ".".join(str(p) for p in full) or "<root>"
        out.append(f"{path}:{line_of(full)}: {where}: {' '.join(str(msg).split())}")
    return list(dict.fromkeys(out))
