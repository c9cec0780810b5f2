"""atom_entropy: the utilization EMA, the coefficient ramp, the hooks, and the manifest."""

from __future__ import annotations

import json
import math

import pytest
from foxhunt_atom_entropy import plugin
from foxhunt_atom_entropy.adaptive import AtomEntropyOptions, adaptive_rate, coefficient, update_ema

from foxhunt_core.hookspecs import RunContext
from foxhunt_core.plugins import discover

DEFAULT = AtomEntropyOptions()


def test_ema_on_a_table_of_readings():
    """Hand-computed: the first reading initialises; alpha = clip(|e| / (|e| + 0.1), 0.01, 0.3)."""
    table = [  # (reading, alpha used, EMA after)
        (0.80, None, 0.80),  # first reading initialises the EMA
        (0.80, 0.01, 0.80),  # no error: the floor rate 0.01
        (0.30, 0.30, 0.65),  # |e| = 0.5 -> 0.833, capped at 0.3
        (0.30, 0.30, 0.545),  # |e| = 0.35 -> 0.778, capped
        (0.56, 0.015 / 0.115, 0.545 + 0.015 * 0.015 / 0.115),  # |e| = 0.015 -> 0.1304 (inside the clamp)
        (float("nan"), None, 0.545 + 0.015 * 0.015 / 0.115),  # a non-finite reading is ignored
    ]
    ema = None
    for reading, alpha, want in table:
        if alpha is not None:
            assert adaptive_rate(reading - ema, DEFAULT) == pytest.approx(alpha)
        ema = update_ema(ema, reading, DEFAULT)
        assert ema == pytest.approx(want, abs=1e-12)


def test_rate_floor_and_options():
    assert adaptive_rate(0.0005, DEFAULT) == 0.01  # 0.004975 is below the floor
    fast = AtomEntropyOptions(alpha_min=0.5, alpha_max=1.0, alpha_error_scale=0.01)
    assert update_ema(0.9, 0.1, fast) == pytest.approx(0.9 - (0.8 / 0.81) * 0.8)
    with pytest.raises(ValueError, match="alpha_min must not exceed alpha_max"):
        AtomEntropyOptions(alpha_min=0.5, alpha_max=0.2)
    with pytest.raises(ValueError, match="extra"):
        AtomEntropyOptions.model_validate({"treshold": 0.5})


@pytest.mark.parametrize(
    "ema, threshold, gain, want",
    [
        (None, 0.5, 1.0, 0.010),  # before the first reading: the base
        (1.00, 0.5, 1.0, 0.010),
        (0.50, 0.5, 1.0, 0.010),  # at the threshold: the base
        (0.40, 0.5, 1.0, 0.012),  # base + base * (1 - 0.4 / 0.5)
        (0.25, 0.5, 1.0, 0.015),
        (0.00, 0.5, 1.0, 0.020),  # twice the base at zero utilization (plan)
        (0.15, 0.3, 2.0, 0.020),  # thresholds are options: base * (1 + 2 * (1 - 0.15 / 0.3))
        (0.35, 0.3, 2.0, 0.010),
        (0.10, 0.5, 0.0, 0.010),  # no gain: constant
    ],
)
def test_coefficient_on_a_table_of_utilizations(ema, threshold, gain, want):
    opts = AtomEntropyOptions(utilization_threshold=threshold, ramp_gain=gain)
    assert coefficient(0.01, ema, opts) == pytest.approx(want)


def _ctx(options=None) -> RunContext:
    return RunContext(step=0, total_steps=100, iqn_readiness=0.0, base_entropy_coeff=0.004,
                      entropy_coeff=0.004, options={} if options is None else {"atom_entropy": options})


@pytest.mark.parametrize("options", [None, {}, AtomEntropyOptions()])
def test_hooks_keep_json_state_on_the_context(options):
    ctx = _ctx(options)
    assert plugin.entropy_coefficient(ctx=ctx, base=0.004) == pytest.approx(0.004)  # no reading yet
    for util in (0.9, 0.2, 0.2, 0.2):
        plugin.q_stats(ctx=ctx, record={"step": 1, "atom_utilization": util})
    st = ctx.stash["atom_entropy"]
    assert st["readings"] == 4
    ema = st["utilization_ema"]
    assert 0.2 < ema < 0.5
    c = plugin.entropy_coefficient(ctx=ctx, base=0.004)
    assert c == pytest.approx(0.004 * (2 - ema / 0.5))
    assert st["coefficient"] == c
    assert json.loads(json.dumps(ctx.stash)) == ctx.stash  # checkpointable


def test_base_coefficient_option_overrides_the_core_base():
    ctx = _ctx({"base_coefficient": 0.05, "utilization_threshold": 0.8})
    plugin.q_stats(ctx=ctx, record={"atom_utilization": 0.4})
    assert plugin.entropy_coefficient(ctx=ctx, base=0.004) == pytest.approx(0.05 * 1.5)


def test_manifest_is_discovered_and_validated():
    reg = discover()
    assert "atom_entropy" not in reg.problems
    p = reg.plugins["atom_entropy"]
    assert p.position == 2
    assert set(p.manifest.hooks) == {"q_stats", "entropy_coefficient"}
    assert p.manifest.kernels == () and p.manifest.parameter_count() == 0
    for name, field in AtomEntropyOptions.model_fields.items():
        assert field.description, name
    assert not math.isnan(coefficient(0.0, 0.0, DEFAULT))
