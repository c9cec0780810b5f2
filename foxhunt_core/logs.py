"""Run logging: a structlog JSON-lines log per run directory, plus readable console output."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import structlog


class RunLog:
    """Writes one JSON object per event to ``<run>/log.jsonl`` and, if asked, a line to stderr."""

    def __init__(self, path: Path | None, console: bool = True) -> None:
        self._fh: TextIO | None = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115
        self.console = console
        self._render = structlog.processors.JSONRenderer(sort_keys=False)
        self._stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)

    def event(self, event: str, **fields: Any) -> None:
        record = self._stamp(None, "info", {"event": event, **fields})
        if self._fh is not None:
            self._fh.write(self._render(None, "info", dict(record)) + "\n")
            self._fh.flush()

    def say(self, message: str) -> None:
        if self.console:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def jsonable(x: Any) -> Any:
    """Round-trip through JSON with NumPy scalars turned into Python numbers."""
    return json.loads(json.dumps(x, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.t0
