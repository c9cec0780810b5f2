"""TensorBoard event files of a run (tensorboardX), on by default (``train.tensorboard``).

The event files go into the run directory itself, so ``tensorboard --logdir runs/`` shows every
run. Tags:

* ``stats/<key>`` — every number of each Q-statistics record (losses, Q-statistics, atom
  utilization, raw drift, entropy coefficient, plugin signals, ...), a list as ``<key>/<i>``;
* ``throughput/updates_per_second`` — over the stats interval that ends at the step;
* ``<split>/<policy>/<metric>`` — evaluation metrics: ``val/...`` at every selection check,
  ``test/...`` (or the split evaluated) when the run is evaluated.

A run without a directory, or with ``train.tensorboard: false``, writes nothing.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


class Board:
    """A tensorboardX writer that a run feeds its records and evaluations."""

    def __init__(self, out_dir: Path | None, enabled: bool) -> None:
        # The writer (and its event file) is made at the first event, not here: a run that is
        # refused while it is built (a damaged checkpoint, say) leaves its directory untouched.
        self._logdir = str(out_dir) if out_dir is not None and enabled else None
        self._writer: Any = None
        self._last: tuple[float, int] | None = None

    @property
    def writer(self) -> Any:
        if self._writer is None and self._logdir is not None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=self._logdir, flush_secs=30)
        return self._writer

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            return
        self.writer.add_scalar(tag, float(value), step)

    def stats(self, record: dict[str, Any]) -> None:
        """One Q-statistics record (keyed by its ``step``) and the interval's update rate."""
        if self._logdir is None:
            return
        step = int(record["step"])
        for key, value in record.items():
            if key == "step":
                continue
            if isinstance(value, (list, tuple)):
                for i, v in enumerate(value):
                    self._scalar(f"stats/{key}/{i}", v, step)
            else:
                self._scalar(f"stats/{key}", value, step)
        now = time.perf_counter()
        if self._last is not None and step > self._last[1] and now > self._last[0]:
            self._scalar("throughput/updates_per_second", (step - self._last[1]) / (now - self._last[0]), step)
        self._last = (now, step)

    def evaluation(self, split: str, table: dict[str, dict[str, float]], step: int) -> None:
        if self._logdir is None:
            return
        for policy, row in table.items():
            for metric, value in row.items():
                self._scalar(f"{split}/{policy}/{metric}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self._logdir = None  # nothing is written after close
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
