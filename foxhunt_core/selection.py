"""Model selection on the validation split: which parameters a run deploys and reports.

Every ``select.every`` updates (and at the end of training) the greedy policy of the current
parameters walks the validation split once (:func:`foxhunt_core.evaluate.evaluate`); the
parameters with the highest validation return so far are kept (a copy, saved in the checkpoint
under ``best/``). The test split is evaluated for those parameters only, so the number reported
was never used to choose them.

Verdict: the best parameters have an **edge on validation** when their validation return beats
flat's (which is 0: flat never trades) and, with ``select.edge_test: bootstrap`` (the default),
when that return is also above every reference policy of ``select.edge_over`` (flat,
buy-and-hold, the linear forecast, momentum) by a statistically meaningful margin: the
block-bootstrap lower bound of the return over each, at ``select.confidence``, is above zero
(:mod:`foxhunt_core.edge`). A return earned by riding a market's drift, or one that the noise of a
short validation split could have produced, is no edge. Otherwise the run has found **no edge
on validation** and its evaluation table says so. With ``select.fallback: flat`` the deployed
policy is then the flat policy (it never trades); with ``none`` the best parameters are still
deployed, under that warning. Everything here is decided on the validation split; the test
split is evaluated only after it.

Without a validation split (``market.val_fraction: 0``) or with ``select.every: 0`` there is no
selection: the last parameters are deployed and the table says that they were not selected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NO_EDGE = "no edge found on validation"


@dataclass
class Selection:
    """The selection state of a run (JSON-able but for ``params``, which are a parameter tree)."""

    every: int
    fallback: str
    edge_test: str = "return"
    confidence: float = 0.95
    best_step: int | None = None
    best_return: float | None = None
    flat_return: float = 0.0
    best_bounds: dict[str, float] | None = None
    """The bootstrap lower bounds of the best parameters' return over each reference policy."""
    history: list[dict[str, float]] = field(default_factory=list)
    params: Any = None

    @property
    def active(self) -> bool:
        return self.every > 0

    def due(self, step: int) -> bool:
        return self.active and step % self.every == 0

    def offer(self, step: int, metrics: dict[str, float], params_copy: Any,
              bounds: dict[str, float] | None = None) -> bool:
        """Record the validation metrics of the parameters at ``step`` (and the lower bounds of
        their return over the reference policies, :func:`foxhunt_core.edge.edge_bounds`); keep
        them when best. ``params_copy`` is called only when they are kept. Returns whether they were."""
        ret = float(metrics["total_return"])
        record = {"step": step, **{k: float(v) for k, v in metrics.items()}}
        record.update({f"lower_over_{k}": float(v) for k, v in (bounds or {}).items()})
        self.history.append(record)
        if self.best_return is not None and not ret > self.best_return:
            return False
        self.best_step, self.best_return, self.params = step, ret, params_copy()
        self.best_bounds = None if bounds is None else {k: float(v) for k, v in bounds.items()}
        return True

    @property
    def bootstrapped(self) -> bool:
        """Whether the edge is judged by the bootstrap bounds (the test is on and they were taken)."""
        return self.edge_test == "bootstrap" and bool(self.best_bounds)

    @property
    def edge(self) -> bool | None:
        """Whether the best parameters have an edge on validation (module docstring; None before
        any evaluation)."""
        if self.best_return is None:
            return None
        beats_flat = self.best_return > self.flat_return
        if not self.bootstrapped:
            return beats_flat
        return beats_flat and min(self.best_bounds.values()) > 0.0  # type: ignore[union-attr]

    @property
    def deploys_flat(self) -> bool:
        return self.fallback == "flat" and self.edge is False

    def _bounds_text(self) -> str:
        if not self.bootstrapped:
            return ""
        parts = ", ".join(f"{k} {v:+.4f}" for k, v in self.best_bounds.items())  # type: ignore[union-attr]
        return f"; {self.confidence:.0%} lower bound of the return over {parts}"

    def verdict(self) -> str:
        if not self.active or self.best_return is None:
            return "no selection: the last parameters are evaluated"
        what = (f"selected at update {self.best_step} on validation (return {self.best_return:+.4f}, "
                f"flat {self.flat_return:+.4f}{self._bounds_text()})")
        if self.edge:
            return what
        return f"{NO_EDGE}: {what}" + ("; the deployed policy is flat (select.fallback)" if self.deploys_flat
                                       else "; the best parameters are deployed anyway")

    def state(self) -> dict[str, Any]:
        return {"best_step": self.best_step, "best_return": self.best_return, "flat_return": self.flat_return,
                "best_bounds": self.best_bounds, "history": self.history}

    def load(self, state: dict[str, Any] | None, params: Any) -> None:
        if not state:
            return
        self.best_step, self.best_return = state["best_step"], state["best_return"]
        self.flat_return = float(state.get("flat_return", 0.0))
        bounds = state.get("best_bounds")
        self.best_bounds = {k: float(v) for k, v in bounds.items()} if bounds else None
        self.history = list(state.get("history", []))
        self.params = params if self.best_step is not None else None

    def report(self) -> dict[str, Any]:
        return {**self.state(), "every": self.every, "fallback": self.fallback, "edge_test": self.edge_test,
                "confidence": self.confidence, "edge": self.edge,
                "deployed": "flat" if self.deploys_flat else ("best" if self.params is not None else "last"),
                "verdict": self.verdict()}
