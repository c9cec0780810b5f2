"""Options of ``rk4_tau`` in a flag file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Rk4TauOptions(BaseModel):
    """Options of ``rk4_tau``: when to integrate with RK4, and how finely."""

    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(
        0.5, ge=0, description="RK4 is used while the xLSTM context_norm signal exceeds this (plan: 0.5); "
        "otherwise the core's exact step.")
    max_step_ratio: float = Field(
        0.1, gt=0, le=2.0,
        description="Largest sub-step over tau. RK4 is stable below ~2.785; 0.1 keeps the error under 1e-6 "
        "of |1 - liquid_mod| for every step (see foxhunt_rk4_tau.integrate).")
    max_substeps: int = Field(
        100_000, ge=1, description="Sub-steps per branch and interval at most; beyond, the core's exact step "
        "is taken (counted).")
