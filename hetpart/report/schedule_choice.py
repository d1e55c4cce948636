"""The table of `partition --schedule auto` / `--microbatches auto`: every candidate tried and the chosen one,
read from plan.json's `schedule_choice` (NOTE [schedule choice] in partitioner/schedule_choice.py)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from hetpart.errors import HetpartError
from hetpart.plan_report import REDO, PlanReport
from hetpart.report.table import format_us, simulated_step
from hetpart.units import format_bytes


SHOWN = 12  # rows of the table; plan.json's `schedule_choice` has every candidate


def schedule_choice_table(record: dict, rows_max: int = SHOWN) -> Table:
    """One row per candidate, the shortest predicted step first, those without a plan last; at most `rows_max`
    of them, the chosen one and GPipe with 4 microbatches (`partition`'s default) always among them."""
    table = Table(box=box.SIMPLE_HEAD, title="schedule choice (simulated step of each candidate's plan)")
    for col in ("schedule", "V", "M", "predicted step", "bubble", "peak memory / capacity (tightest device)", "fits",
                "plan", "chosen"):
        table.add_column(col, justify="left" if col in ("schedule", "plan", "fits") or col.startswith("peak") else
                         "right")
    rows = sorted(record["candidates"], key=lambda c: (c["step_us"] is None, c["step_us"] or 0))
    keep = [c for c in rows if c["chosen"] or (c["schedule"], c["microbatches"]) == ("gpipe", 4)]
    top = [c for c in rows if c not in keep][:max(0, rows_max - len(keep))]
    rows = [c for c in rows if c in keep or c in top]
    table.caption = (f"{len(record['candidates']) - len(rows)} more candidate(s) in plan.json's schedule_choice"
                     if len(rows) < len(record["candidates"]) else None)
    for c in rows:
        mem = (f"{format_bytes(c['memory_bytes'])} / {format_bytes(c['capacity_bytes'])} ({c['device']})"
               if c["memory_bytes"] is not None else "-")
        plan = {"quick": "quick DP", "solved": f"solved ({c['solver_status']})"}.get(c["plan"] or "", "-")
        if c["plan"] == "quick" and c["virtual_stages"] is not None:
            plan = f"virtual DP ({c['solver_status']})"
        fits = ("yes" + (f": {c['note']}" if c["note"] else "")) if c["fits"] else f"no: {c['note']}"
        table.add_row(c["schedule"], str(c["virtual_stages"] or "-"), str(c["microbatches"]),
                      format_us(c["step_us"]) if c["step_us"] is not None else "-",
                      f"{c['bubble']:.0%}" if c["bubble"] is not None else "-", mem, fits, plan,
                      "<-" if c["chosen"] else "")
    return table


def schedule_choice_lines(record: dict) -> list[str]:
    """What the table needs said: what was chosen, how far the claim goes, what was not tried."""
    chosen = record["chosen"]
    v = f" --virtual-stages {chosen['virtual_stages']}" if chosen["virtual_stages"] else ""
    solved = sum(c["plan"] == "solved" for c in record["candidates"])
    how = (f"{solved} GPipe/1F1B finalist(s) solved, up to {record['solve_time_limit_s']:g} s each" if solved else
           "the finalists are interleaved: their plans are the virtual-stage DP's")
    lines = [f"chosen: --schedule {chosen['schedule']}{v} --microbatches {chosen['microbatches']}: the best "
             f"simulated step of the {record['finalists']} shortest quick plans ({how}); its gap and certificate "
             "above are of that schedule and microbatch count only (NOTE [schedule choice])"]
    lines += [f"not tried: {why}" for why in record["left_out"]]
    return lines


def print_schedule_choice(plan: PlanReport, console: Console) -> None:
    """The candidates' table and the choice, when the plan was made with `auto`; nothing otherwise."""
    if plan.schedule_choice is None:
        return
    try:
        _print(plan, console)
    except (KeyError, TypeError, ValueError, AttributeError) as err:  # a plan.json edited by hand
        raise HetpartError(f"plan.json: 'schedule_choice' is not what `hetpart partition` writes ({type(err).__name__}: "
                           f"{err}); the plan was edited or truncated: {REDO}") from None


def _print(plan: PlanReport, console: Console) -> None:
    assert plan.schedule_choice is not None
    console.print(schedule_choice_table(plan.schedule_choice))
    for line in schedule_choice_lines(plan.schedule_choice):
        console.print(line, markup=False, highlight=False)
    (chosen,) = [c for c in plan.schedule_choice["candidates"] if c["chosen"]]
    written_us = simulated_step(plan).step_ns / 1000
    if abs(written_us - chosen["step_us"]) > 0.001:  # the plan written is not the one whose step was predicted
        console.print(f"hetpart: warning: the written plan's simulated step {format_us(written_us)} is not the "
                      f"{format_us(chosen['step_us'])} predicted for the chosen candidate; partition again with "
                      "the chosen options given explicitly", markup=False, highlight=False)
    if plan.training and plan.schedule != "gpipe":  # run's default in training is the plan's schedule
        console.print(f"run it with: hetpart run DIR --mode training (it runs the plan's {plan.schedule})",
                      markup=False, highlight=False)
