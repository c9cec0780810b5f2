"""Options of ``xlstm_context`` in a flag file."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class XlstmContextOptions(BaseModel):
    """Options of ``xlstm_context``: cell size, the online learner, the input normalizer."""

    model_config = ConfigDict(extra="forbid")

    context_dim: int = Field(
        8, ge=1, le=64, description="Width d of the context vector and of the d x d memory (plan: 8).")
    learning_rate: float = Field(1e-3, gt=0, le=1, description="Adam step size of the cell's own optimizer.")
    clip_norm: float = Field(
        1.0, gt=0, description="Largest global gradient norm of one update (larger ones are scaled down).")
    forget_bias: float = Field(
        3.0, description="Initial forget-gate bias: sigmoid(3) ~ 0.95 keeps memory over about twenty intervals.")
    normalizer_rate: float = Field(
        0.02, gt=0, le=1,
        description="Floor of the normalizer's rate: the running mean and variance weigh reading t by "
        "max(1/t, rate), a plain average at first, then an exponential one over ~1/rate intervals.")
    input_clip: float = Field(
        1e6, gt=0, description="Raw readings are limited to +-input_clip before normalization (counted).")
    z_clip: float = Field(5.0, gt=0, description="Normalized inputs are limited to +-z_clip standard deviations.")
    init_seed: int = Field(
        0, ge=0, description="Seed of the cell's initial weights (its own generator: the run's draws are untouched).")
