"""Options of ``tlob_inject`` in a flag file: which schema features each branch reads, by name."""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict, Field, field_validator

from foxhunt_core.market import schema

ORDER_FEATURES = ("bid_ask_spread", "l1_depth_imbalance", "queue_pressure")
URGENCY_FEATURES = ("spread_velocity", "depth_change_rate", "trade_arrival_rate")


def _check_names(names: tuple[str, ...]) -> tuple[str, ...]:
    """The names, if each is a feature of the schema and none repeats (else a one-line reason)."""
    if not names:
        raise ValueError("the list is empty: name at least one feature of foxhunt_core.market.schema "
                         "(or disable tlob_inject)")
    for n in names:
        if n not in schema.INDEX:
            near = difflib.get_close_matches(n, schema.FEATURE_NAMES, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise ValueError(f"unknown feature {n!r} ({hint}the names are foxhunt_core.market.schema.FEATURE_NAMES)")
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise ValueError(f"feature {n!r} is named twice")
        seen.add(n)
    return names


class TlobInjectOptions(BaseModel):
    """Options of ``tlob_inject``: the feature columns appended to each widened branch's GLU input."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    order_features: tuple[str, ...] = Field(
        ORDER_FEATURES,
        description="Schema feature names (foxhunt_core.market.schema) appended, in this order, to the order "
        "branch's GLU input (plan: bid-ask spread, L1 depth imbalance, queue pressure).",
    )
    urgency_features: tuple[str, ...] = Field(
        URGENCY_FEATURES,
        description="Schema feature names appended, in this order, to the urgency branch's GLU input "
        "(plan: spread velocity, depth change rate, trade arrival rate).",
    )

    @field_validator("order_features", "urgency_features")
    @classmethod
    def _known_distinct(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        return _check_names(names)
