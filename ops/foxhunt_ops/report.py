"""The rollout report: one self-contained HTML file (inline CSS, figures as embedded PNG) from the ledger.

Reading order: the outcome and the good flag set; the decisions table (one row per decision:
stage, analysis — Successful, Failed or Inconclusive — action, actor, the deciding gates); the
story (every decision, in order, with its full reason); an overview of return, value bias and
throughput across stages; one section per stage (its flag file and plugins, how its trials
started — from scratch or warm from the good stage — each trial with its return, value bias,
utilization, throughput and GPU, each gate's verdict with value, bound, interval and p-value,
and a figure of drift and utilization over training, and return, value bias and throughput per
seed beside the stage it was judged against); the final flag file; the plan; the controller's
session log.
"""

from __future__ import annotations

import datetime as dt
import html
import json
from pathlib import Path
from typing import Any

from foxhunt_core.checkpoint import atomic_write_text

from .gates import analysis
from .ledger import Ledger
from .metrics import metric_value
from .plots import overview_figure, stage_figure
from .stages import ResolvedStage
from .state import RolloutState, walk

CSS = """
body{font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:30px}
h3{font-size:15px;margin:18px 0 6px} table{border-collapse:collapse;margin:6px 0 10px;font-size:12.5px}
td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top} th{background:#f5f5f5}
td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}
.pass,.promote{color:#1a7f37;font-weight:600} .fail,.rollback,.abort{color:#c62828;font-weight:600}
.skip,.pause,.inconclusive,.Inconclusive{color:#8a6d00;font-weight:600} .dry{color:#777;font-style:italic}
.Successful{color:#1a7f37;font-weight:600} .Failed{color:#c62828;font-weight:600} .muted{color:#666}
.badge{display:inline-block;padding:2px 9px;border-radius:10px;background:#eee;font-weight:600}
img{max-width:100%} li{margin-bottom:4px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _f(x: Any, spec: str = "+.4f") -> str:
    if x is None:
        return "&ndash;"
    v = float(x)
    return format(v, spec) if v == v and abs(v) != float("inf") else _e(x)


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(rows_i) + "</tr>" for rows_i in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _td(x: str, cls: str = "") -> str:
    return f'<td class="{cls}">{x}</td>' if cls else f"<td>{x}</td>"


def _trials_table(trials: list[dict[str, Any]]) -> str:
    rows = []
    for t in trials:
        r = t["result"]
        rows.append([_td(_e(t["seed"])), _td(_e(t["status"]), "pass" if t["status"] == "done" else "fail"),
                     _td(_f(metric_value(r, "eval_return")), "n"), _td(_f(metric_value(r, "value_bias"), "+.3f"), "n"),
                     _td(_bias_detail(r), "n"), _td(_f(metric_value(r, "raw_q_drift")), "n"),
                     _td(_f(metric_value(r, "atom_utilization"), ".3f"), "n"),
                     _td(_f(metric_value(r, "updates_per_second"), ".1f"), "n"),
                     _td(_f(metric_value(r, "steady_updates_per_second"), ".1f"), "n"),
                     _td(_f(metric_value(r, "non_finite"), ".0f"), "n"), _td(_e(t.get("gpu") or "")),
                     _td(_f(t["wall_s"], ".1f"), "n"), _td(_e(t["run_dir"])), _td(_e(t["error"] or ""))])
    return _table(["seed", "status", "test return", "value bias", "mean Q / mean return", "raw drift (dry run)",
                   "atom util.", "updates/s", "after the first", "non-finite", "GPU", "wall s", "run directory",
                   "error"], rows)


def _bias_detail(r: dict[str, Any] | None) -> str:
    vb = (r or {}).get("value_bias") or {}
    if "q_mean" not in vb:
        return "&ndash;"
    return f"{_f(vb['q_mean'], '+.3f')} / {_f(vb['return_mean'], '+.3f')}"


def _interval(v: dict[str, Any]) -> str:
    ci = v.get("interval")
    if not ci:
        return "&ndash;"
    return f"[{_f(ci[0], '+.4g')}, {_f(ci[1], '+.4g')}] ({float(v.get('confidence') or 0.9):.0%})"


def _gates_table(verdicts: list[dict[str, Any]]) -> str:
    rows = []
    for v in verdicts:
        bound = " ".join(x for x in (f"min {v['min']:g}" if v["min"] is not None else "",
                                      f"max {v['max']:g}" if v["max"] is not None else "") if x)
        seeds = ", ".join(f"{k}: {_f(x, '+.4g')}" for k, x in v["per_seed"].items())
        verdict = f'<span class="{_e(v["verdict"])}">{_e(v["verdict"])}</span>'
        if v["dry_run"]:
            verdict += ' <span class="dry">(dry run)</span>'
        decide = " by its interval" if v.get("decide_by") == "interval" else ""
        limit = f", failure_limit {v['failure_limit']}" if v.get("failure_limit") else ""
        rows.append([_td(_e(v["gate"])), _td(_e(f"{v['metric']} ({v['compare']}, {v['aggregate']}{decide}{limit})")),
                     _td(_f(v["value"], "+.4g"), "n"), _td(_e(bound)), _td(_interval(v), "n"),
                     _td(_f(v["p_value"], ".3g") + (f" ({_e(v['test'])})" if v["test"] != "none" else ""), "n"),
                     _td(seeds), _td(verdict), _td(_e(v["reason"]))])
    return _table(["gate", "metric", "value", "bound", "interval", "p", "per seed", "verdict", "reason"], rows)


def _analysis(d: dict[str, Any]) -> str:
    """Successful, Failed or Inconclusive for a controller's judgement; the operator's verb otherwise."""
    if d["actor"] != "controller" or d["action"] == "skip":
        return "&ndash;"
    a = analysis(d["gates"])
    return f'<span class="{a}">{a}</span>'


def _decisions_table(decisions: list[dict[str, Any]]) -> str:
    rows = []
    for d in decisions:
        live = [g for g in d["gates"] if not g.get("dry_run")]
        deciding = [g for g in live if g["verdict"] in ("fail", "inconclusive")] or live
        gates = ", ".join(f"{g['gate']} {g['verdict']}" for g in deciding)
        rows.append([_td(_e(d["seq"]), "n"), _td(_e(d["stage_id"])), _td(_analysis(d)),
                     _td(f'<span class="{_e(d["action"])}">{_e(d["action"])}</span>'), _td(_e(d["actor"])),
                     _td(_e(gates)), _td(_e(d["good_stage_id"] or "none"))])
    return _table(["#", "stage", "analysis", "action", "actor", "deciding gates", "good flag set after"], rows)


def _start_note(trials: list[dict[str, Any]]) -> str:
    """How a stage's trials started: from scratch, or warm from the good stage (and whether at step 0
    the function was that stage's)."""
    warm = [t["result"]["warm_start"] for t in trials if t["result"] and t["result"].get("warm_start")]
    if not warm:
        return "<p>Trials started from scratch.</p>"
    w = warm[0]
    new = ", ".join(w["new_plugins"]) or "none"
    same = ("yes: every new plugin declares starts_as_identity" if w["function_preserved"] else
            "no: " + ", ".join(f"{n} does not declare starts_as_identity"
                               for n, ok in w["starts_as_identity"].items() if not ok)
            + ("; removed: " + ", ".join(w["removed_plugins"]) if w["removed_plugins"] else ""))
    return (f"<p>Warm start ({len(warm)} of {len(trials)} trials): from the good stage's final checkpoints "
            f"(plugins {_e(', '.join(w['from_plugins']) or 'none')}, update {_e(w['from_step'])}); newly enabled, "
            f"parameters at their init: {_e(new)}; {_e(w['transferred'])} tensors transferred"
            + (f", widened: {_e(', '.join(w['widened']))}" if w["widened"] else "")
            + f". Same function at step 0: {_e(same)}.</p>")


def _story(decisions: list[dict[str, Any]]) -> str:
    items = []
    for d in decisions:
        items.append(f'<li><b>{_e(d["stage_id"])}</b> &mdash; <span class="{_e(d["action"])}">'
                     f'{_e(d["action"].upper())}</span> by {_e(d["actor"])}: {_e(d["reason"])} '
                     f'<span class="muted">(good flag set after it: {_e(d["good_stage_id"] or "none")})</span></li>')
    return "<ol>" + "".join(items) + "</ol>" if items else "<p>No decision yet.</p>"


def _stage_section(s: ResolvedStage, led: Ledger, decisions: list[dict[str, Any]],
                   by_stage: dict[str, dict[int, Any]]) -> str:
    mine = [d for d in decisions if d["stage_id"] == s.stage_id]
    judged = next((d for d in mine if d["actor"] == "controller"), None)
    out = [f'<h2 id="{_e(s.stage_id)}">{_e(s.stage_id)}</h2>']
    info = (f"source <code>{_e(s.source)}</code>; plugins: {_e(', '.join(s.plugins) or 'none')}; "
            f"seeds {_e(', '.join(map(str, s.seeds)))}; {_e(s.steps)} updates per trial")
    if s.flags_sha256:
        info += f"; flags <code>{_e(s.flags_file)}</code> sha256 <code>{_e(s.flags_sha256[:16])}</code>"
    out.append(f"<p>{info}</p>" + (f"<p class='muted'>{_e(s.note)}</p>" if s.note else ""))
    for d in mine:
        head = _analysis(d)
        out.append(f'<p>{head + " &rarr; " if head != "&ndash;" else ""}<span class="{_e(d["action"])}">'
                   f'{_e(d["action"].upper())}</span> ({_e(d["actor"])}): {_e(d["reason"])}</p>')
    if s.skip_reason:
        return "\n".join(out)
    trials = led.trials(s.stage_id)
    if trials:
        out.append("<h3>Trials</h3>" + _start_note(trials) + _trials_table(trials))
    if judged and judged["gates"]:
        out.append("<h3>Gates</h3>" + _gates_table(judged["gates"]))
    if trials:
        prev_id = _judged_against(decisions, judged)
        gates = {g.name: g.model_dump() for g in s.gates}
        img = stage_figure(s.stage_id, by_stage.get(s.stage_id, {}),
                           by_stage.get(prev_id) if prev_id else None, prev_id, gates)
        out.append(f'<img alt="{_e(s.stage_id)} figures" src="data:image/png;base64,{img}">')
    return "\n".join(out)


def _judged_against(decisions: list[dict[str, Any]], judged: dict[str, Any] | None) -> str | None:
    """The good stage when ``judged`` was decided (the good stage of the decision before it)."""
    if judged is None:
        return decisions[-1]["good_stage_id"] if decisions else None
    before = [d for d in decisions if d["seq"] < judged["seq"]]
    return before[-1]["good_stage_id"] if before else None


def render(rollout_dir: Path) -> str:
    """The report of a rollout directory, as HTML text."""
    led = Ledger.open(rollout_dir)
    try:
        meta, stages, decisions = led.meta(), led.stages(), led.decisions()
        st: RolloutState = walk(stages, decisions)
        by_stage = {s.stage_id: {t["seed"]: t["result"] for t in led.trials(s.stage_id)} for s in stages}
        good = next((s for s in stages if s.stage_id == st.good), None)
        parts = [f"<h1>Rollout of plan {_e(meta.get('plan_name'))}</h1>",
                 f"<p class='muted'>{_e(rollout_dir)} &middot; plan {_e(meta.get('plan_path'))} sha256 "
                 f"<code>{_e(meta.get('plan_sha256', '')[:16])}</code> &middot; report written "
                 f"{_e(dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds'))}</p>",
                 f"<p>Status: <span class='badge'>{_e(st.status.replace('_', ' '))}</span> &middot; good flag set: "
                 f"<b>{_e(good.stage_id if good else 'none')}</b>"
                 + (f" (plugins: {_e(', '.join(good.plugins) or 'none')})" if good else "") + "</p>",
                 "<h2>Decisions</h2>", _decisions_table(decisions) if decisions else "<p>No decision yet.</p>",
                 "<h2>The story</h2>", _story(decisions)]
        judged_ids = [s.stage_id for s in stages if by_stage.get(s.stage_id)]
        if judged_ids:
            parts.append(f'<img alt="overview" src="data:image/png;base64,{overview_figure(judged_ids, by_stage)}">')
        parts += [_stage_section(s, led, decisions, by_stage) for s in stages]
        parts.append("<h2>Final flag set</h2>")
        if good and good.flags_text:
            parts.append(f"<p>{_e(good.stage_id)}: <code>{_e(good.flags_file)}</code> (also "
                         f"<code>good-flags.yaml</code>), sha256 <code>{_e(good.flags_sha256)}</code></p>"
                         f"<pre>{_e(good.flags_text)}</pre>")
        else:
            parts.append("<p>None: no stage was promoted.</p>")
        events = "".join(f"<li>{_e(e['at'])} {_e(e['kind'])} {_e(json.dumps(e['detail']))}</li>"
                         for e in led.events())
        parts += [f"<details><summary>Plan</summary><pre>{_e(meta.get('plan_text', ''))}</pre></details>",
                  f"<details><summary>Controller sessions</summary><ul>{events}</ul></details>"]
    finally:
        led.close()
    title = f"foxhunt rollout {meta.get('plan_name', '')}"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts)}</body></html>\n")


def write_report(rollout_dir: Path, out: Path | None = None) -> Path:
    """Write the report (default ``<rollout>/report.html``) atomically; returns its path."""
    path = Path(out) if out is not None else Path(rollout_dir) / "report.html"
    atomic_write_text(path, render(Path(rollout_dir)))
    return path
