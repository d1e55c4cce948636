"""report.html: one self-contained page per partition (inline SVG and CSS, no scripts, no network).

It shows the graph coarsened to blocks and coloured by stage, the schedule
timeline from `hetpart.partitioner.simulate`, memory per device against
capacity, the plan table and the baselines. Its inputs are plan.json (a `PlanReport`) and a
`BlockGraph` (built from the FX graph by `blocks.py`); this module never
imports torch.
"""

from __future__ import annotations

import dataclasses

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetpart.partitioner.simulate import Timeline
from hetpart.plan_report import PlanReport
from hetpart.report.table import (
    SCHEDULE_NAMES,
    baseline_lines,
    format_us,
    share_of_bottleneck,
    simulated_step,
    transfer_us,
)
from hetpart.units import format_bytes, format_rate

# ColorBrewer Set3 (partition.dot uses Graphviz's `set312`, the same colours).
PALETTE = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
           "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f"]
SEND_COLOUR = "#9e9e9e"
# NOTE [report legibility]: what a new user could not read in the first report, and the fix.
# - Backward passes were the forward's colour at 75% opacity, which no one tells apart on a
#   pale palette: they are hatched (BWD_HATCH over the stage's colour), labelled B<m> against
#   F<m>, and the timeline has a legend.
# - Memory bars were linear in the share of capacity, so a stage using 0.002-3% of an 80 GiB
#   device drew a 1-pixel bar: the axis is logarithmic from MEM_LOG_FLOOR to 100%, with
#   labelled ticks, and the exact use is written beside each bar.
# - HF block names (`model.encoder.embed_tokens`) overflowed their boxes: the prefix every
#   block shares (`model.`) is dropped from the labels, a long label is drawn smaller and then
#   keeps its ends (`decoder.…dropout`); the box's tooltip has the full name.
# - The graph view's boxes: NOTE [report blocks] in blocks.py.
BWD_HATCH = ('<pattern id="bwd-hatch" patternUnits="userSpaceOnUse" width="6" height="6" '
             'patternTransform="rotate(45)"><rect width="6" height="6" fill="none"/>'
             '<line x1="0" y1="0" x2="0" y2="6" stroke="#222" stroke-width="2" stroke-opacity="0.55"/></pattern>')
MEM_LOG_FLOOR = 1e-5  # 0.001% of capacity: the left end of the memory axis, lower if a stage uses less
BOX_LABEL_CHARS = 18  # what a graph box's 150 px hold at 13 px (bold); longer labels drop to 10 px,
BOX_LABEL_CHARS_SMALL = 26  # which hold this many; longer still lose their middle


def stage_colour(stage: int) -> str:
    return PALETTE[stage % len(PALETTE)]


@dataclass(frozen=True)
class Block:
    """A top-level module (`blocks.3`, `wte`, `inputs`, ...) and where its nodes went."""

    name: str
    nodes_by_stage: dict[int, int]  # stage -> number of its nodes in that stage
    flops: int = 0


@dataclass(frozen=True)
class BlockEdge:
    src: str
    dst: str
    bytes: int  # activation bytes per microbatch flowing from src to dst


@dataclass(frozen=True)
class BlockGraph:
    blocks: list[Block] = field(default_factory=list)  # in graph (topological) order
    edges: list[BlockEdge] = field(default_factory=list)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _svg_text(x: float, y: float, text: str, *, size: int = 12, anchor: str = "start", weight: str = "normal",
              fill: str = "#222") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}">{_e(text)}</text>')


def _graph_svg(graph: BlockGraph) -> str:
    """Blocks in graph order, left to right in rows; stripes when a block spans stages."""
    if not graph.blocks:
        return "<p>No block structure was recorded for this graph.</p>"
    box_w, box_h, gap_x, gap_y, cols = 150, 56, 34, 40, 7
    cols = min(cols, len(graph.blocks))
    pos = {}
    for i, b in enumerate(graph.blocks):
        row, col = divmod(i, cols)
        pos[b.name] = (20 + col * (box_w + gap_x), 20 + row * (box_h + gap_y))
    rows = (len(graph.blocks) + cols - 1) // cols
    width, height = 40 + cols * (box_w + gap_x) - gap_x, 40 + rows * (box_h + gap_y) - gap_y
    parts = [f'<svg class="graph" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="graph by stage">',
             '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#555"/></marker></defs>']
    order = {b.name: i for i, b in enumerate(graph.blocks)}
    labels = _box_labels([b.name for b in graph.blocks])
    for e in graph.edges:
        if e.src not in pos or e.dst not in pos:
            continue
        (x1, y1), (x2, y2) = pos[e.src], pos[e.dst]
        tip = f"{e.src} → {e.dst}: {format_bytes(e.bytes)} per microbatch"
        if order[e.dst] == order[e.src] + 1 and y1 == y2:  # neighbours on one row: a short arrow
            parts.append(f'<line x1="{x1 + box_w}" y1="{y1 + box_h / 2}" x2="{x2 - 2}" y2="{y2 + box_h / 2}" '
                         f'stroke="#555" stroke-width="1.5" marker-end="url(#arrow)"><title>{_e(tip)}</title></line>')
        else:  # skips and row changes: a curve from the bottom of src
            sx, ex = x1 + box_w / 2, x2 + box_w / 2
            if y2 > y1:  # to the top of dst on a later row
                sy, ey, cy = y1 + box_h, y2, (y1 + box_h + y2) / 2
            else:  # to the bottom of dst on the same row, bending below it
                sy, ey, cy = y1 + box_h, y2 + box_h, y1 + box_h + gap_y * 0.8
            parts.append(f'<path d="M {sx:.1f} {sy:.1f} Q {(sx + ex) / 2:.1f} {cy:.1f} {ex:.1f} {ey:.1f}" '
                         'fill="none" stroke="#777" stroke-opacity="0.55" stroke-width="1.2" '
                         f'marker-end="url(#arrow)"><title>{_e(tip)}</title></path>')
    for b in graph.blocks:
        x, y = pos[b.name]
        total = sum(b.nodes_by_stage.values())
        where = ", ".join(f"stage {k}: {n}" for k, n in sorted(b.nodes_by_stage.items())) or "no compute nodes"
        parts.append(f'<g class="block"><title>{_e(b.name)} — {_e(where)}; {b.flops / 1e6:.3g} MFLOP</title>')
        if total:
            offset = 0.0
            for k, n in sorted(b.nodes_by_stage.items()):
                h = box_h * n / total
                parts.append(f'<rect x="{x}" y="{y + offset:.2f}" width="{box_w}" height="{h:.2f}" '
                             f'fill="{stage_colour(k)}"/>')
                offset += h
        outline = "none" if total else "#fff"
        parts.append(f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="5" fill="{outline}" '
                     'stroke="#444" stroke-width="1"/>')
        label, size = labels[b.name]
        parts.append(_svg_text(x + box_w / 2, y + 22, label, size=size, anchor="middle", weight="600"))
        stages = "+".join(str(k) for k in sorted(b.nodes_by_stage)) or "-"
        count = f"{total} node{'s' if total != 1 else ''}"
        parts.append(_svg_text(x + box_w / 2, y + 41, f"{count} · stage {stages}", size=11, anchor="middle",
                               fill="#333"))
        parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts)


def _box_labels(names: list[str]) -> dict[str, tuple[str, int]]:
    """name -> (label, font size) for the graph's boxes (NOTE [report legibility])."""
    modules = [n for n in names if n not in ("inputs", "output")]
    prefix = ""  # the longest dotted prefix of every module block (HF's wrapper `model`), if any
    for part in (modules[0].split(".")[:-1] if modules else []):
        candidate = f"{prefix}{part}."
        if not all(n.startswith(candidate) or n == candidate[:-1] for n in modules) or any(
                n[len(candidate):].isdigit() for n in modules):  # `blocks.3` keeps its name, not `3`
            break
        prefix = candidate
    labels = {}
    for name in names:
        label = name[len(prefix):] if prefix and name.startswith(prefix) else name
        size = 13 if len(label) <= BOX_LABEL_CHARS else 10
        room = BOX_LABEL_CHARS_SMALL
        if len(label) > room:
            label = label[: room // 2 - 1] + "…" + label[-(room - room // 2):]
        labels[name] = (label, size)
    return labels


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = span / ticks
    magnitude = 10 ** len(str(int(raw))) / 10 if raw >= 1 else 1.0
    for m in (1, 2, 5, 10):
        if raw <= m * magnitude:
            return m * magnitude
    return 10 * magnitude


def _gantt_svg(timeline: Timeline, labels: list[str]) -> str:
    """One row per stage; forwards in the stage's colour (microbatch number inside), transfers grey on both rows."""
    label_w, row_h, width, top = 170, 34, 1100, 26
    span_ns = max(timeline.step_ns, 1)
    plot_w = width - label_w - 20
    x_of = lambda ns: label_w + plot_w * ns / span_ns  # noqa: E731
    kinds = {e.kind for e in timeline.events if e.duration_ns}
    height = top + row_h * timeline.num_stages + 34 + 26
    parts = [f'<svg class="gantt" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="schedule timeline">',
             f'<defs>{BWD_HATCH}</defs>']
    for k in range(timeline.num_stages):
        y = top + k * row_h
        parts.append(f'<rect x="{label_w}" y="{y}" width="{plot_w}" height="{row_h - 6}" fill="#f4f4f4"/>')
        parts.append(_svg_text(label_w - 8, y + row_h / 2, labels[k], size=12, anchor="end"))
    for e in timeline.events:
        if e.duration_ns == 0:
            continue
        x, w = x_of(e.start_ns), max(plot_w * e.duration_ns / span_ns, 0.8)
        tip = (f"{e.kind} microbatch {e.microbatch}: stage {e.stage}"
               f"{f' → {e.peer}' if e.peer is not None else ''}, {format_us(e.start_ns / 1000)} – "
               f"{format_us(e.end_ns / 1000)}")
        rows = [e.stage] if e.peer is None else [e.stage, e.peer]
        for k in rows:
            y = top + k * row_h
            fill = SEND_COLOUR if e.kind == "send" else stage_colour(e.stage)
            parts.append(f'<rect class="{e.kind}" x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row_h - 10}" '
                         f'fill="{fill}" stroke="#333" stroke-width="0.5"><title>{_e(tip)}</title></rect>')
            if e.kind == "bwd":  # hatched over the stage's colour: NOTE [report legibility]
                parts.append(f'<rect x="{x:.2f}" y="{y + 2}" width="{w:.2f}" height="{row_h - 10}" '
                             f'fill="url(#bwd-hatch)" pointer-events="none"/>')
            if e.kind != "send" and w > 14:
                letter = {"bwd": "B", "bwd_input": "I", "bwd_weight": "W"}.get(e.kind, "F")  # I, W: zero bubble
                label = f"{letter}{e.microbatch}" if kinds - {"fwd", "send"} else str(e.microbatch)
                parts.append(_svg_text(x + w / 2, y + row_h / 2 + 1, label, size=11, anchor="middle",
                                       weight="700" if e.kind == "bwd" else "normal"))
    axis_y = top + timeline.num_stages * row_h
    step_us = _nice_step(span_ns / 1000)
    tick = 0.0
    while tick * 1000 <= span_ns + 1e-9:
        x = x_of(tick * 1000)
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{axis_y}" stroke="#ccc" stroke-width="0.5"/>')
        parts.append(_svg_text(x, axis_y + 14, format_us(tick), size=10, anchor="middle", fill="#555"))
        tick += step_us
    legend = [("fwd", "forward"), ("bwd", "backward"), ("send", "transfer")]
    x = label_w
    for kind, text in (k for k in legend if k[0] in kinds):
        y = axis_y + 26
        fill = SEND_COLOUR if kind == "send" else "#cfcfcf"
        parts.append(f'<rect class="legend-{kind}" x="{x}" y="{y}" width="26" height="14" fill="{fill}" '
                     'stroke="#333" stroke-width="0.5"/>')
        if kind == "bwd":
            parts.append(f'<rect x="{x}" y="{y}" width="26" height="14" fill="url(#bwd-hatch)"/>')
        parts.append(_svg_text(x + 32, y + 8, text, size=11, fill="#333"))
        x += 32 + 9 * len(text) + 24
    parts.append("</svg>")
    return "\n".join(parts)


def _memory_svg(plan: PlanReport) -> str:
    """Every device of the cluster: memory of its stage against its capacity (idle devices say so)."""
    used = {s.device: s for s in plan.stages}
    devices = plan.cluster.devices
    label_w, bar_w, row_h, top = 230, 620, 28, 22
    width, height = label_w + bar_w + 320, top + 12 + row_h * len(devices)
    parts = [f'<svg class="memory" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="memory per device (log scale)">']
    shares = [s.memory_bytes / s.capacity_bytes for s in plan.stages if s.capacity_bytes and s.memory_bytes]
    floor = min([MEM_LOG_FLOOR] + [10 ** math.floor(math.log10(x)) for x in shares if x < 1])  # every bar shows
    decades = round(-math.log10(floor))
    for k in range(decades + 1):  # ticks at 0.001%, 0.01%, ..., 100%
        x = label_w + bar_w * k / decades
        parts.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#ccc" '
                     'stroke-width="0.5"/>')
        parts.append(_svg_text(x, top - 12, f"{100 * floor * 10**k:g}%", size=10, anchor="middle",
                               fill="#555"))
    for i, d in enumerate(devices):
        y = top + i * row_h
        s = used.get(d.name)
        capacity = s.capacity_bytes if s else d.mem_bytes
        label = f"{d.name} ({d.type})"
        parts.append(_svg_text(label_w - 8, y + 15, label, size=12, anchor="end"))
        parts.append(f'<rect x="{label_w}" y="{y}" width="{bar_w}" height="{row_h - 8}" fill="#eee" stroke="#bbb"/>')
        if s:
            share = s.memory_bytes / capacity if capacity else 0.0
            parts.append(f'<rect class="used" x="{label_w}" y="{y}" width="{memory_bar_px(share, bar_w, floor):.2f}" '
                         f'height="{row_h - 8}" fill="{stage_colour(s.index)}" stroke="#555" stroke-width="0.5"/>')
            text = (f"stage {s.index}: {format_bytes(s.memory_bytes)} / {format_bytes(capacity)} "
                    f"({share * 100:.3g}%)")
        else:
            text = f"idle: 0 / {format_bytes(capacity)}"
        parts.append(_svg_text(label_w + bar_w + 8, y + 15, text, size=11, fill="#333"))
    parts.append("</svg>")
    return "\n".join(parts)


def memory_bar_px(share: float, bar_w: float, floor: float = MEM_LOG_FLOOR) -> float:
    """Width of a bar for `share` of capacity on the log axis from `floor` to 100% (NOTE [report
    legibility]); 0 for nothing used."""
    if share <= 0:
        return 0.0
    position = (math.log10(min(share, 1.0)) - math.log10(floor)) / -math.log10(floor)
    return bar_w * min(max(position, 0.0), 1.0) or 1.5  # below the floor: a sliver, still there


def _plan_table(plan: PlanReport) -> str:
    head = ["stage", "device", "type", "nodes", "GFLOP", "memory / capacity", "compute", "transfer", "time",
            "% of max"]
    rows = []
    for s in plan.stages:
        cells = [s.index if s.pipeline is None else f"{s.pipeline}.{s.index}", s.device, s.device_type, s.node_count, f"{s.flops / 1e9:.3g}",
                 f"{format_bytes(s.memory_bytes)} / {format_bytes(s.capacity_bytes)}",
                 format_us(s.compute_us), format_us(transfer_us(s)), format_us(s.predicted_time_us),
                 f"{share_of_bottleneck(plan, s):.0%}"]
        swatch = f'<span class="swatch" style="background:{stage_colour(s.index)}"></span>'
        rows.append("<tr>" + "".join(f"<td>{swatch if i == 0 else ''}{_e(c)}</td>" for i, c in enumerate(cells))
                    + "</tr>")
    return ("<table><thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead><tbody>"
            + "\n".join(rows) + "</tbody></table>")


def _baselines(plan: PlanReport) -> str:
    lines = baseline_lines(plan)
    if not lines:
        return "<p>No baselines recorded in plan.json.</p>"
    return "<ul>" + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>"


_CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px 32px; color: #222;
       background: #fff; }
h1 { font-size: 22px; margin: 0 0 6px; } h2 { font-size: 17px; margin: 26px 0 8px; border-bottom: 1px solid #ddd; }
.sub { color: #555; margin-bottom: 14px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 18px; } .card span { color: #666; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 10px; border-bottom: 1px solid #e4e4e4; text-align: right; }
th { background: #f6f6f6; } td:nth-child(2), td:nth-child(3), th:nth-child(2), th:nth-child(3) { text-align: left; }
.swatch { display: inline-block; width: 11px; height: 11px; margin-right: 6px; border: 1px solid #555;
          vertical-align: -1px; }
.legend span { margin-right: 16px; font-size: 13px; }
svg text { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; dominant-baseline: middle; }
.scroll { overflow-x: auto; }
"""


def slowest_pipeline(plan: PlanReport) -> tuple[PlanReport, str]:
    """The plan whose schedule the page plays, and a note: itself, or of several pipelines the slowest
    (issue 19), as a plan of its own stages and microbatches."""
    if not plan.pipelines:
        return plan, ""
    q = max(plan.pipelines, key=lambda q: q.time_us)
    note = (f" · {len(plan.pipelines)} data-parallel pipelines (stage p.k: stage k of pipeline p); the schedule is "
            f"pipeline {q.index}'s, the slowest, for its {q.microbatches} microbatches")
    return dataclasses.replace(plan, stages=q.stages, microbatches=q.microbatches, pipelines=None), note


def render_report(plan: PlanReport, graph: BlockGraph) -> str:
    """The whole page as one string (deterministic for the same inputs)."""
    shown, several = slowest_pipeline(plan)
    timeline = simulated_step(shown)
    labels = [f"stage {s.index} · {s.device} ({s.device_type})" for s in shown.stages]
    model = plan.model.model
    cards = [
        ("bottleneck per microbatch", format_us(plan.bottleneck_us)),
        ("predicted throughput", f"{format_rate(plan.predicted_samples_per_s)} samples/s"),
        ("lower bound", format_us(plan.lower_bound_us)),
        ("gap", f"{plan.gap:.2%}"),
        ("solver", plan.solver_status),
        (f"step of {timeline.microbatches} microbatches", format_us(timeline.step_ns / 1000)),
        ("pipeline bubble", f"{timeline.bubble_fraction:.0%}"),
    ]
    legend = "".join(f'<span><span class="swatch" style="background:{stage_colour(s.index)}"></span>'
                     f'stage {s.index}: {_e(s.device)} ({_e(s.device_type)})</span>' for s in plan.stages)
    legend += f'<span><span class="swatch" style="background:{SEND_COLOUR}"></span>transfer</span>'
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hetpart: {_e(model)} on {_e(plan.cluster.name)}</title>
<style>{_CSS}</style>
</head>
<body>
<h1>{_e(model)} on {_e(plan.cluster.name)}</h1>
<div class="sub">{len(plan.stages)} stages on {len(plan.cluster.devices)} devices ·
{_e(plan.mode)} · microbatch of {plan.microbatch_size} · {plan.microbatches} microbatches ·
objective {_e(plan.objective)}{_e(several)}</div>
<div class="cards">{''.join(f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>' for k, v in cards)}</div>
<p class="legend">{legend}</p>
<h2>Graph by stage</h2>
<div class="sub">Nodes grouped by repeated layer (<code>layers.3</code>) or top-level module; a block split
between stages is striped.</div>
<div class="scroll">{_graph_svg(graph)}</div>
<h2>Schedule ({SCHEDULE_NAMES[timeline.schedule]}, simulated)</h2>
<div class="sub">Each microbatch's forward (F) and backward (B, hatched) per stage; a transfer (grey) occupies
both stages it joins.
Step {format_us(timeline.step_ns / 1000)}; bubble {timeline.bubble_fraction:.0%}.</div>
<div class="scroll">{_gantt_svg(timeline, labels)}</div>
<h2>Memory per device</h2>
<div class="sub">Share of each device's capacity on a log scale (from 0.001%, or lower if a stage uses less, to
100%); the bytes are beside each bar.</div>
<div class="scroll">{_memory_svg(plan)}</div>
<h2>Plan</h2>
{_plan_table(plan)}
<h2>Baselines</h2>
{_baselines(plan)}
</body>
</html>
"""


def write_report(path: Path, plan: PlanReport, graph: BlockGraph) -> None:
    path.write_text(render_report(plan, graph), encoding="utf-8")
