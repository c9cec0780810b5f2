"""The rollout ledger: SQLite in WAL mode, one row per trial and per decision.

Tables (``ledger.sqlite`` in the rollout directory)::

    meta       key -> value: schema version, the plan (name, path, sha256, text), creation time
    stages     one row per plan stage as resolved at `run`: source, generated flag text and sha256,
               plugins, seeds, steps, gates, skip reason (frozen: a resume never re-reads the plan)
    trials     one row per (stage, seed): status running | done | failed | cancelled, run dir,
               exit code, error, result (JSON: final metrics, series, baselines), times, the GPU
               that ran it (its CUDA_VISIBLE_DEVICES; NULL on the CPU)
    decisions  one row per decision, in order: promote | rollback | abort | pause | skip, by the
               controller or an operator, with the reason, every gate's verdict, the stage's
               metrics, the stage's flag hash and the good (last promoted) stage after it
    events     the controller's session log (starts, resumes, recovered trials, interruptions):
               it differs between an interrupted and an uninterrupted rollout by design

Crash safety: every change is one transaction; ``synchronous=FULL`` makes a committed
transaction durable. A trial row goes ``running`` (before its process starts) then ``done`` or
``failed`` (after its result is read), so a crash leaves at most ``running`` rows, which a
resume reruns from scratch; a ``done``/``failed`` row is never rerun or rewritten. The
controller writes at most one decision per stage (a unique index enforces it), and a resume that
finds a stage's trials finished but no decision judges it from the stored results.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any

from .errors import LedgerError
from .metrics import VOLATILE_METRICS
from .stages import ResolvedStage
from .trial import TrialOutcome, TrialSpec

SCHEMA_VERSION = 1
LEDGER = "ledger.sqlite"
FINAL = ("done", "failed")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS stages (
    idx INTEGER PRIMARY KEY, stage_id TEXT NOT NULL UNIQUE, spec TEXT NOT NULL,
    flags_file TEXT, flags_sha256 TEXT, skip_reason TEXT);
CREATE TABLE IF NOT EXISTS trials (
    stage_id TEXT NOT NULL REFERENCES stages(stage_id), seed INTEGER NOT NULL, steps INTEGER,
    flags_sha256 TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('running', 'done', 'failed', 'cancelled')),
    run_dir TEXT NOT NULL, exit_code INTEGER, error TEXT, result TEXT,
    started_at TEXT NOT NULL, finished_at TEXT, wall_s REAL, gpu TEXT,
    PRIMARY KEY (stage_id, seed));
CREATE TABLE IF NOT EXISTS decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, stage_id TEXT NOT NULL REFERENCES stages(stage_id),
    action TEXT NOT NULL CHECK (action IN ('promote', 'rollback', 'abort', 'pause', 'skip')),
    actor TEXT NOT NULL CHECK (actor IN ('controller', 'operator')),
    reason TEXT NOT NULL, gates TEXT NOT NULL, metrics TEXT NOT NULL, flags_sha256 TEXT,
    good_stage_id TEXT, good_flags_sha256 TEXT, created_at TEXT NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS one_controller_decision_per_stage
    ON decisions (stage_id) WHERE actor = 'controller';
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, at TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL);
"""


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def dumps(x: Any) -> str:
    return json.dumps(x, sort_keys=True, allow_nan=False)


class Ledger:
    """A rollout's ledger (open it with :meth:`open`)."""

    def __init__(self, path: Path, db: sqlite3.Connection) -> None:
        self.path, self.db = path, db

    @classmethod
    def open(cls, rollout_dir: Path, create: bool = False) -> Ledger:
        path = Path(rollout_dir) / LEDGER
        if not create and not path.is_file():
            raise LedgerError(f"{rollout_dir}: no rollout ledger ({LEDGER}) here")
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        db.executescript(SCHEMA)
        if "gpu" not in {r["name"] for r in db.execute("PRAGMA table_info(trials)")}:  # a ledger from before it
            db.execute("ALTER TABLE trials ADD COLUMN gpu TEXT")
        led = cls(path, db)
        version = led.meta().get("schema_version")
        if version is not None and int(version) != SCHEMA_VERSION:
            raise LedgerError(f"{path}: ledger schema {version}, this foxhunt reads {SCHEMA_VERSION}")
        return led

    def close(self) -> None:
        self.db.close()

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Run statements in one immediate transaction."""
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in statements:
                cur.execute(sql, args)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    # ------------------------------------------------------------------ setup
    def meta(self) -> dict[str, str]:
        return {r["key"]: r["value"] for r in self.db.execute("SELECT key, value FROM meta")}

    @property
    def initialised(self) -> bool:
        return "plan_sha256" in self.meta()

    def initialise(self, plan_path: str, plan_name: str, plan_sha: str, plan_text: str,
                   stages: list[ResolvedStage], extra: dict[str, str] | None = None) -> None:
        """Record the plan and its resolved stages, all at once (a crash leaves all or nothing);
        ``extra``: more meta entries (the command line's overrides of the plan)."""
        meta = {"schema_version": str(SCHEMA_VERSION), "plan_path": plan_path, "plan_name": plan_name,
                "plan_sha256": plan_sha, "plan_text": plan_text, "created_at": now(), **(extra or {})}
        stmts: list[tuple[str, tuple[Any, ...]]] = [("INSERT INTO meta VALUES (?, ?)", kv) for kv in meta.items()]
        stmts += [("INSERT INTO stages VALUES (?, ?, ?, ?, ?, ?)",
                   (s.index, s.stage_id, dumps(s.to_json()), None if s.skip_reason else s.flags_file,
                    s.flags_sha256, s.skip_reason)) for s in stages]
        self._tx(stmts)

    def stages(self) -> list[ResolvedStage]:
        """The stages, each row checked like a plan's stage (:mod:`foxhunt_ops.ledger_checks`)."""
        from .ledger_checks import check_stage_row

        out = []
        for r in self.db.execute("SELECT stage_id, spec FROM stages ORDER BY idx"):
            try:
                spec = json.loads(r["spec"])
                check_stage_row(r["stage_id"], spec, self.path)
                out.append(ResolvedStage.from_json(spec))
            except (ValueError, TypeError, KeyError) as exc:
                raise LedgerError(f"{self.path}: stages row {r['stage_id']!r}: unreadable "
                                  f"({' '.join(str(exc).split())})") from None
        return out

    def event(self, kind: str, **detail: Any) -> None:
        self._tx([("INSERT INTO events (at, kind, detail) VALUES (?, ?, ?)", (now(), kind, dumps(detail)))])

    def events(self) -> list[dict[str, Any]]:
        return [{**dict(r), "detail": json.loads(r["detail"])} for r in self.db.execute(
            "SELECT * FROM events ORDER BY seq")]

    # ------------------------------------------------------------------ trials
    def trials(self, stage_id: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM trials", ()
        if stage_id is not None:
            sql, args = sql + " WHERE stage_id = ?", (stage_id,)
        rows = self.db.execute(sql + " ORDER BY stage_id, seed", args)
        return [{**dict(r), "result": json.loads(r["result"]) if r["result"] else None} for r in rows]

    def trial_started(self, spec: TrialSpec, run_dir: str) -> None:
        """Mark a trial running (a new row, or a rerun of one that never finished)."""
        self._tx([("""INSERT INTO trials (stage_id, seed, steps, flags_sha256, status, run_dir, started_at)
                      VALUES (?, ?, ?, ?, 'running', ?, ?)
                      ON CONFLICT (stage_id, seed) DO UPDATE SET
                        steps = excluded.steps, flags_sha256 = excluded.flags_sha256, status = 'running',
                        run_dir = excluded.run_dir, exit_code = NULL, error = NULL, result = NULL,
                        started_at = excluded.started_at, finished_at = NULL, wall_s = NULL, gpu = NULL
                      WHERE trials.status NOT IN ('done', 'failed')""",
                   (spec.stage_id, spec.seed, spec.steps, spec.flags_sha256, run_dir, now()))])

    def trial_finished(self, out: TrialOutcome) -> None:
        self._tx([("""UPDATE trials SET status = ?, exit_code = ?, error = ?, result = ?, finished_at = ?,
                      wall_s = ?, gpu = ? WHERE stage_id = ? AND seed = ? AND status = 'running'""",
                   (out.status, out.exit_code, out.error, dumps(out.result) if out.result is not None else None,
                    now(), out.wall_s, out.gpu, out.stage_id, out.seed))])

    def trials_cancelled(self, keys: list[tuple[str, int]]) -> None:
        self._tx([("UPDATE trials SET status = 'cancelled' WHERE stage_id = ? AND seed = ? AND status = 'running'",
                   key) for key in keys])

    # ------------------------------------------------------------------ decisions
    def decide(self, stage_id: str, action: str, actor: str, reason: str, *, gates: list[dict[str, Any]] | None = None,
               metrics: dict[str, Any] | None = None, flags_sha256: str | None = None,
               good: tuple[str, str | None] | None = None) -> int:
        """Record a decision; returns its sequence number."""
        good_id, good_sha = good if good is not None else (None, None)
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            cur.execute("""INSERT INTO decisions (stage_id, action, actor, reason, gates, metrics, flags_sha256,
                           good_stage_id, good_flags_sha256, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                        (stage_id, action, actor, reason, dumps(gates or []), dumps(metrics or {}), flags_sha256,
                         good_id, good_sha, now()))
            seq = int(cur.lastrowid or 0)
        except sqlite3.IntegrityError as exc:
            cur.execute("ROLLBACK")
            raise LedgerError(f"stage {stage_id} already has a controller decision") from exc
        cur.execute("COMMIT")
        return seq

    def decisions(self) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM decisions ORDER BY seq")
        return [{**dict(r), "gates": json.loads(r["gates"]), "metrics": json.loads(r["metrics"])} for r in rows]

    def last_seq(self) -> int:
        row = self.db.execute("SELECT MAX(seq) AS s FROM decisions").fetchone()
        return int(row["s"] or 0)

    def operator_stop_since(self, seq: int) -> dict[str, Any] | None:
        """An operator's abort or rollback recorded after decision ``seq`` (a running controller stops)."""
        row = self.db.execute("""SELECT * FROM decisions WHERE seq > ? AND actor = 'operator'
                                 AND action IN ('abort', 'rollback') ORDER BY seq LIMIT 1""", (seq,)).fetchone()
        return dict(row) if row else None

    # ------------------------------------------------------------------ comparison
    def snapshot(self) -> dict[str, Any]:
        """The ledger without what differs between two runs of the same plan: timestamps, timings
        (wall seconds, throughput), the GPU each trial ran on and the session log. Two rollouts of
        one plan — interrupted and resumed or not, local or on Ray — have equal snapshots."""
        trials = []
        for t in self.trials():
            t = {k: v for k, v in t.items() if k not in ("started_at", "finished_at", "wall_s", "gpu")}
            if t["result"]:
                t["result"] = {**t["result"], "final": {k: v for k, v in t["result"]["final"].items()
                                                       if k not in VOLATILE_METRICS}}
            trials.append(t)
        decisions = []
        for d in self.decisions():
            d = {k: v for k, v in d.items() if k != "created_at"}
            d["metrics"] = {k: v for k, v in d["metrics"].items() if k not in VOLATILE_METRICS}
            d["gates"] = [{k: v for k, v in g.items() if k in ("gate", "metric", "dry_run")} if g.get("volatile")
                          else g for g in d["gates"]]
            decisions.append(d)
        stages = [dict(r) for r in self.db.execute("SELECT * FROM stages ORDER BY idx")]
        meta = {k: v for k, v in self.meta().items() if k in ("schema_version", "plan_name", "plan_sha256")}
        return {"meta": meta, "stages": stages, "trials": trials, "decisions": decisions}
