"""The execution plan written out: the kernel choices of the update at the plan's batch size.

:func:`choices` walks the update as :mod:`.forward` and :mod:`.backward` run it (the three
forwards, each GLU group's forward and backward, the trunk's backward) and asks the plan the same
questions they ask, so each line says which kernel runs there and why. :func:`to_dict` is what a
run writes to ``gpu_plan.json``; :func:`explain` is what ``foxhunt train --explain`` prints.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .forward import HEADS
from .layout import DIRECTION, MAGNITUDE
from .plan import ExecutionPlan
from .table import ARRANGEMENTS, FILL_RULE, THRESHOLDS

Choice = dict[str, Any]


def _choice(part: str, what: str, kernel: str, why: str) -> Choice:
    return {"part": part, "what": what, "kernel": kernel, "why": why}


def _forward(plan: ExecutionPlan, part: str, rows: int, stacked: bool, wants: list[tuple[str, ...]]) -> list[Choice]:
    """One forward group of ``rows`` rows (its segments wanting ``wants``), as ForwardGroup runs it."""
    sh = plan.shapes
    D = len(sh.offsets) - 1
    trunk = "no fused kernel takes the trunk's GEMMs" + (" (strided-batched over the stacked trees)" if stacked else "")
    out = [_choice(part, "trunk and VSN", "cuBLAS GEMMs (bias and ReLU in the epilogue), vsn_forward", trunk)]
    glu = plan.glu_gemm_for(stacked)
    wanted_past_direction = any(tuple(x for x in w if x != HEADS) for w in wants)
    in_heads: set[int] = set()  # the groups whose dueling forward runs in their heads' kernel
    for g in sh.groups:
        d0 = g[0]
        name = "the direction branch" if d0 == DIRECTION else f"branches {list(g)}"
        if glu and sh.z_input[d0]:
            out.append(_choice(part, f"GLU of {name}", "glu_gemm", glu.why))
            span_ok = (g[0], g[-1] + 1) in ((DIRECTION, 1), (1, D))
            wanted = d0 == DIRECTION or wanted_past_direction
            fill = plan.heads_dueling_at(rows, len(g))
            if span_ok and wanted and fill:
                in_heads.add(d0)
                out.append(_choice(part, f"advantage heads of {name}", "heads_dueling (the dueling forward in the "
                                   "heads' kernel)", fill.why))
            else:
                why = fill.why if span_ok and wanted else "no dueling forward wanted of these rows"
                out.append(_choice(part, f"advantage heads of {name}", "linear_gemm", why))
        else:
            why = glu.why if sh.z_input[d0] else "the branch forms its own input (branch-input columns)"
            gate = plan.gate_kernels[0]
            out.append(_choice(part, f"GLU of {name}", f"cuBLAS GEMM, {gate}", why))
            batched = not stacked and sh.joint and len(g) > 1 and len({sh.head_widths[d] for d in g}) == 1 \
                and plan.batched_advantages(rows)
            out.append(_choice(part, f"advantage heads of {name}",
                               "one strided-batched cuBLAS GEMM" if batched else "cuBLAS GEMMs, one per branch",
                               plan.batched_advantages(rows).why if not stacked else "stacked parameter trees"))
        if d0 == DIRECTION and DIRECTION not in in_heads:
            out.append(_choice(part, "dueling forward of the direction branch", "dueling_softmax_forward",
                               "its heads' kernel does not take it here (above)"))
    rest = [g for g in sh.groups if g[0] != DIRECTION]
    if wanted_past_direction and not (len(rest) == 1 and rest[0][0] in in_heads):
        out.append(_choice(part, f"dueling forward of branches 1..{D - 1}", "dueling_softmax_forward",
                           "their heads' kernel does not take it here (above)"))
    return out


def _backward(plan: ExecutionPlan, B: int) -> list[Choice]:
    sh = plan.shapes
    part = f"backward ({B} rows)"
    out = [_choice(part, "dueling backward", "dueling_backward (two passes)", "the dueling aggregation's backward "
                   "has one form: the branches past the direction branch, then the direction branch with the "
                   "magnitude branch's conditioning gradient")]
    for g in sh.groups:
        name = "the direction branch" if g[0] == DIRECTION else f"branches {list(g)}"
        tc = plan.glu_backward_at(B, len(g))
        if tc:
            out.append(_choice(part, f"GLU backward of {name}", "glu_backward_gemm (the heads' input gradient and "
                               "the gate's backward in one kernel)", tc.why))
        else:
            gate = plan.gate_kernels[1]
            out.append(_choice(part, f"GLU backward of {name}", f"cuBLAS GEMM, {gate}", tc.why))
        if MAGNITUDE in g and sh.z_input[MAGNITUDE]:
            dq = tc and plan.glu_backward_dq
            out.append(_choice(part, "z's direction-Q columns' gradient",
                               "in glu_backward_gemm's epilogue" if dq else "a cuBLAS GEMM of its own",
                               plan.glu_backward_dq.why if tc else tc.why))
        wz = plan.wgrad_gemm if sh.z_input[g[0]] else None
        out.append(_choice(part, f"GLU weight gradients of {name}", "wgrad_gemm" if wz else "cuBLAS GEMM",
                           wz.why if wz is not None else "the branch's own input (branch-input columns)"))
        wh = plan.wgrad_heads_at(B)
        out.append(_choice(part, f"advantage heads' weight gradients of {name}",
                           "wgrad_gemm_sets" if wh else "cuBLAS GEMMs, one per branch", wh.why))
    out.append(_choice(part, "z's gradient", "one cuBLAS GEMM over every group" if plan.joint_dz else
                       "cuBLAS GEMMs, one per group", plan.joint_dz.why))
    relu = plan.relu_gemm_at(B)
    out.append(_choice(part, "trunk's input gradients", "linear_gemm_relu_backward" if relu else
                       "cuBLAS GEMMs, relu_backward", relu.why))
    out.append(_choice(part, "weight gradients", "on the side stream, beside the input gradients" if plan.side_stream
                       else "in line on one stream", plan.side_stream.why))
    return out


def choices(plan: ExecutionPlan) -> list[Choice]:
    """Every kernel choice of the update at ``plan.batch`` rows (and of the acting forward at
    ``plan.act_rows``), in the order the update makes them."""
    B = plan.batch
    out: list[Choice] = []
    stack = plan.stacks(B)
    every = ("log_probs", "probs", "q", "var")
    if stack:
        out.append(_choice("update", "the three forwards (online s, online s', target s')",
                           f"one forward of {3 * B} rows over the stacked parameter trees", stack.why))
        out += _forward(plan, f"forwards ({3 * B} rows, stacked)", 3 * B, True, [every, ("q",), (HEADS,)])
    elif plan.pairs:
        beside = "beside them on the side stream" if plan.side_stream else "after them on one stream"
        out.append(_choice("update", "the three forwards", f"the online forwards as one of {2 * B} rows, the "
                           f"target's ({B} rows) {beside}", stack.why))
        out += _forward(plan, f"target forward ({B} rows)", B, False, [(HEADS,)])
        out += _forward(plan, f"online forwards ({2 * B} rows)", 2 * B, False, [every, ("q",)])
    else:
        out.append(_choice("update", "the three forwards", f"each forward of {B} rows on its own", plan.pairs.why))
        for name, w in (("online s", every), ("online s'", ("q",)), ("target s'", (HEADS,))):
            out += _forward(plan, f"{name} forward ({B} rows)", B, False, [w])
    out += _backward(plan, B)
    out.append(_choice("update", "the Q pipeline at s and its backward",
                       ("on a third stream, its forward beside the bootstrap at s', the rest beside the "
                        "network's backward" if plan.knobs.q_early else "on a third stream after the loss "
                        "kernel, beside the network's backward") if plan.q_stream
                       else "after the network's backward, on the main stream", plan.q_stream.why))
    if plan.act_rows:
        out += _forward(plan, f"acting forward ({plan.act_rows} rows)", plan.act_rows, False, [("q",)])
    return out


def to_dict(plan: ExecutionPlan) -> dict[str, Any]:
    """The plan as ``gpu_plan.json`` holds it: its inputs, the stages' paths, the thresholds and
    arrangements (with where they were measured), every choice of the update."""
    return {
        "device": dataclasses.asdict(plan.device),
        "tf32": plan.tf32,
        "batch": plan.batch,
        "act_rows": plan.act_rows,
        "shapes": dataclasses.asdict(plan.shapes),
        "knobs": dataclasses.asdict(plan.knobs),
        "fill_sms": plan.fill_sms,
        "stages": [dataclasses.asdict(s) for s in plan.stages],
        "thresholds": {name: {"value": getattr(plan.knobs, name), "default": t.value, "rule": t.rule,
                              "measured": t.measured} for name, t in THRESHOLDS.items()},
        "fill_rule": {"rule": FILL_RULE.rule, "measured": FILL_RULE.measured},
        "arrangements": {name: {"on": getattr(plan.knobs, name), "what": a.what, "measured": a.measured}
                         for name, a in ARRANGEMENTS.items()},
        "choices": choices(plan),
    }


def explain(plan: ExecutionPlan) -> str:
    """The plan as text: one line per choice, the reason beneath."""
    d = plan.device
    cap = f"{d.capability[:-1]}.{d.capability[-1]}" if len(d.capability) > 1 else d.capability
    lines = [f"GPU execution plan: {d.name + ', ' if d.name else ''}compute capability {cap}, {d.sm_count} SMs, "
             f"TF32 {'on' if plan.tf32 else 'off'}, batch {plan.batch}"]
    lines.append("stages:")
    for s in plan.stages:
        lines.append(f"  {s.hook} {s.name}: {s.path} path ({s.why})")
    lines.append("thresholds:")
    for name, t in THRESHOLDS.items():
        lines.append(f"  {name} = {getattr(plan.knobs, name)} ({t.measured})")
    lines.append(f"  fill_sms = {plan.fill_sms} ({FILL_RULE.measured})")
    part = None
    for c in choices(plan):
        if c["part"] != part:
            part = c["part"]
            lines.append(f"{part}:")
        lines.append(f"  {c['what']}: {c['kernel']}")
        lines.append(f"      because {c['why']}")
    return "\n".join(lines)
