"""TensorBoard event files of a run (tensorboardX), on by default (``train.tensorboard``).

The event files go into the run directory itself, so ``tensorboard --logdir runs/`` shows every
run. Tags:

* ``stats/<key>`` — every number of each Q-statistics record (losses, Q-statistics, atom
  utilization, raw drift, entropy coefficient, plugin signals, ...), a list as ``<key>/<i>``;
* ``throughput/updates_per_second`` — over the stats interval that ends at the step;
* ``<split>/<policy>/<metric>`` — evaluation metrics: ``val/...`` at every selection check,
  ``test/...`` (or the split evaluated) when the run is evaluated.

A run without a directory, or with ``train.tensorboard: false``, writes nothing. The event file
is opened at the first record, so a command refused before it records anything (a ``resume``
of a damaged checkpoint) leaves the run directory as it was.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


class Board:
    """A tensorboardX writer that a run feeds its records and evaluations."""

    def __init__(self, out_dir: Path | None, enabled: bool) -> None:
        self.writer: Any = None
        self._logdir = str(out_dir) if out_dir is not None and enabled else None
        self._last: tuple[float, int] | None = None

    def _open(self) -> bool:
        """Open the event file at the first record; whether there is one to write to."""
        if self.writer is None and self._logdir is not None:
            from tensorboardX import SummaryWriter

            self.writer = SummaryWriter(logdir=self._logdir, flush_secs=30)
        return self.writer is not None

    def _scalar(self, tag: str, value: Any, step: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
            return
        self.writer.add_scalar(tag, float(value), step)

    def stats(self, record: dict[str, Any]) -> None:
        """One Q-statistics record (keyed by its ``step``) and the interval's update rate."""
        if not self._open():
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
        if not self._open():
            return
        for policy, row in table.items():
            for metric, value in row.items():
                self._scalar(f"{split}/{policy}/{metric}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self._logdir = None  # nothing is written after close
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None
