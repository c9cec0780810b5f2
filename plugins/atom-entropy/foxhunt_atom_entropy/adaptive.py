"""Adaptive atom entropy: the math (plan Task 11, component 9), as pure functions.

A C51 distribution that has *collapsed* puts its mass on few atoms. The core measures atom
utilization every stats interval (:func:`foxhunt_core.qpipe.q_statistics`: the mean fraction
of atoms whose probability is at least ``train.atom_mass_threshold / N``). This plugin smooths
that reading and raises the loss's entropy coefficient while it is low:

* **utilization EMA with an adaptive rate**: the first reading initialises the EMA; after that
  ``alpha = clip(|u - ema| / (|u - ema| + s), alpha_min, alpha_max)`` and
  ``ema <- (1 - alpha) ema + alpha u``. Large surprises move the EMA quickly, noise slowly.
  (The plan initialised the EMA at 1.0 and replaced it by the reading whenever it was above
  0.99; that sentinel also discards the smoothing while utilization is near 1. Here "not yet
  initialised" is explicit.)
* **coefficient**: ``base`` while ``ema >= threshold``; below it
  ``base + gain * base * (1 - ema / threshold)`` — a linear ramp from ``base`` at the threshold
  to ``(1 + gain) * base`` at zero utilization (plan: threshold 0.5, gain 1).
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator


class AtomEntropyOptions(BaseModel):
    """Options of ``atom_entropy`` in a flag file."""

    model_config = ConfigDict(extra="forbid")

    base_coefficient: float | None = Field(
        None, ge=0,
        description="Base entropy coefficient; null uses the core's train.entropy_coeff (the base the hook receives).",
    )
    utilization_threshold: float = Field(
        0.5, gt=0, le=1,
        description="Utilization EMA below which the coefficient ramps up (plan: 0.5). Not the core's "
        "train.atom_mass_threshold, which defines when one atom counts as used.",
    )
    ramp_gain: float = Field(
        1.0, ge=0,
        description="Extra coefficient at zero utilization, in units of the base (plan: 1, i.e. up to twice the base).",
    )
    alpha_min: float = Field(0.01, gt=0, le=1, description="Smallest EMA rate.")
    alpha_max: float = Field(0.3, gt=0, le=1, description="Largest EMA rate.")
    alpha_error_scale: float = Field(
        0.1, gt=0, description="Error scale s of the adaptive rate |err| / (|err| + s) (plan: 0.1)."
    )

    @model_validator(mode="after")
    def _rates(self) -> AtomEntropyOptions:
        if self.alpha_min > self.alpha_max:
            raise ValueError("alpha_min must not exceed alpha_max")
        return self


def adaptive_rate(error: float, opts: AtomEntropyOptions) -> float:
    """``clip(|error| / (|error| + s), alpha_min, alpha_max)``."""
    e = abs(error)
    return min(max(e / (e + opts.alpha_error_scale), opts.alpha_min), opts.alpha_max)


def update_ema(ema: float | None, reading: float, opts: AtomEntropyOptions) -> float | None:
    """The EMA after one utilization reading (``None``: not initialised yet).

    A non-finite reading is ignored (the EMA is returned unchanged).
    """
    if not math.isfinite(reading):
        return ema
    if ema is None:
        return float(reading)
    alpha = adaptive_rate(reading - ema, opts)
    return float((1.0 - alpha) * ema + alpha * reading)


def coefficient(base: float, ema: float | None, opts: AtomEntropyOptions) -> float:
    """The entropy coefficient for utilization EMA ``ema`` (``base`` before the first reading)."""
    thr = opts.utilization_threshold
    if ema is None or ema >= thr:
        return float(base)
    return float(base + opts.ramp_gain * base * (1.0 - ema / thr))
