"""Model selection on the validation split: which parameters a run deploys and reports.

Every ``select.every`` updates (and at the end of training) the greedy policy of the current
parameters walks the validation split once (:func:`foxhunt_core.evaluate.evaluate`); the
parameters with the highest validation return so far are kept (a copy, saved in the checkpoint
under ``best/``). The test split is evaluated for those parameters only, so the number reported
was never used to choose them.

Verdict: when the best validation return does not beat flat's (which is 0: flat never trades),
the run has found **no edge on validation** and its evaluation table says so. With
``select.fallback: flat`` the deployed policy is then the flat policy (it never trades); with
``none`` the best parameters are still deployed, under that warning.

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
    best_step: int | None = None
    best_return: float | None = None
    flat_return: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    params: Any = None

    @property
    def active(self) -> bool:
        return self.every > 0

    def due(self, step: int) -> bool:
        return self.active and step % self.every == 0

    def offer(self, step: int, metrics: dict[str, float], params_copy: Any) -> bool:
        """Record the validation metrics of the parameters at ``step``; keep them when best.
        ``params_copy`` is called only when they are kept. Returns whether they were."""
        ret = float(metrics["total_return"])
        self.history.append({"step": step, **{k: float(v) for k, v in metrics.items()}})
        if self.best_return is not None and not ret > self.best_return:
            return False
        self.best_step, self.best_return, self.params = step, ret, params_copy()
        return True

    @property
    def edge(self) -> bool | None:
        """Whether the best validation return beats flat (None before any evaluation)."""
        return None if self.best_return is None else self.best_return > self.flat_return

    @property
    def deploys_flat(self) -> bool:
        return self.fallback == "flat" and self.edge is False

    def verdict(self) -> str:
        if not self.active or self.best_return is None:
            return "no selection: the last parameters are evaluated"
        what = (f"selected at update {self.best_step} on validation (return {self.best_return:+.4f}, "
                f"flat {self.flat_return:+.4f})")
        if self.edge:
            return what
        return f"{NO_EDGE}: {what}" + ("; the deployed policy is flat (select.fallback)" if self.deploys_flat
                                       else "; the best parameters are deployed anyway")

    def state(self) -> dict[str, Any]:
        return {"best_step": self.best_step, "best_return": self.best_return, "flat_return": self.flat_return,
                "history": self.history}

    def load(self, state: dict[str, Any] | None, params: Any) -> None:
        if not state:
            return
        self.best_step, self.best_return = state["best_step"], state["best_return"]
        self.flat_return = float(state.get("flat_return", 0.0))
        self.history = list(state.get("history", []))
        self.params = params if self.best_step is not None else None

    def report(self) -> dict[str, Any]:
        return {**self.state(), "every": self.every, "fallback": self.fallback, "edge": self.edge,
                "deployed": "flat" if self.deploys_flat else ("best" if self.params is not None else "last"),
                "verdict": self.verdict()}
