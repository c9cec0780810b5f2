"""Options of ``kan_gate`` in a flag file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .spline import Grid

MAX_BASES = 32
"""Most bases the CUDA kernels take (their per-thread gradient accumulator lives in registers)."""


class KanGateOptions(BaseModel):
    """Options of ``kan_gate``: the spline grid, the residual weight's start, the kernel switch."""

    model_config = ConfigDict(extra="forbid")

    grid_min: float = Field(
        -4.0, allow_inf_nan=False, description="Lower end of the spline's input range; inputs below it are clamped."
    )
    grid_max: float = Field(
        4.0, allow_inf_nan=False, description="Upper end of the spline's input range; inputs above it are clamped."
    )
    num_bases: int = Field(
        8, ge=4, le=MAX_BASES,
        description="Cubic B-spline coefficients per unit (num_bases - 3 knot intervals over the range; plan: 8).",
    )
    residual_init: float = Field(
        0.0, ge=-1.0, le=1.0, allow_inf_nan=False,
        description="Initial residual weight r of every unit (gate = clamp(spline(pre) + r * pre, 0, 1); plan: 0).",
    )
    use_cuda_kernels: bool = Field(
        True,
        description="On CuPy float32 inputs, run the gate with the plugin's CUDA kernels; false uses CuPy array "
        "operations (same function; for comparison and debugging).",
    )

    @model_validator(mode="after")
    def _range(self) -> KanGateOptions:
        if not self.grid_max > self.grid_min:
            raise ValueError(f"grid_max ({self.grid_max}) must be above grid_min ({self.grid_min})")
        return self

    def grid(self) -> Grid:
        return Grid(lo=self.grid_min, hi=self.grid_max, num_bases=self.num_bases)
