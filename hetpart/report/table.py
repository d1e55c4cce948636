"""Plan tables for the terminal (rich), read from plan.json (a `PlanReport`) so `partition` and `inspect` agree."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from hetpart.partitioner.bounds import left_out
from hetpart.partitioner.simulate import Timeline, simulate
from hetpart.plan_report import PlanReport, StageReport


SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def format_bytes(n: float) -> str:
    for factor, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n:.0f} B"


def format_us(value: float) -> str:
    return f"{value / 1000:.3g} ms" if value >= 1000 else f"{value:.3g} us"


def transfer_us(stage: StageReport) -> float:
    return stage.transfer_us


def share_of_bottleneck(plan: PlanReport, stage: StageReport) -> float:
    return plan.share_of_bottleneck(stage)


def simulated_step(plan: PlanReport) -> Timeline:
    """The plan's step for its microbatches, played by `simulate` (NOTE [schedule simulation]).

    Forward only, unless every stage carries a `backward_us` (a training plan);
    the schedule is plan.json's `schedule` (default GPipe).
    """
    stages = plan.stages
    ns = lambda us: round(us * 1000)  # noqa: E731
    if all(s.backward_us is not None for s in stages):
        # A training plan's compute_us is forward + backward and its comm_out_us carries the activations
        # and their gradients (NOTE [training costs] in passes/lower.py): half each way.
        return simulate([ns(s.compute_us if s.forward_us is None else s.forward_us) for s in stages],
                        [ns(s.comm_out_us) // 2 for s in stages[:-1]], plan.microbatches,
                        plan.schedule, backward_ns=[ns(s.backward_us) for s in stages])
    return simulate([ns(s.compute_us) for s in stages], [ns(s.comm_out_us) for s in stages[:-1]],
                    plan.microbatches, plan.schedule)


def plan_table(plan: PlanReport) -> Table:
    training = plan.training
    what = f"training with {SCHEDULE_NAMES.get(plan.schedule, plan.schedule)}, " if training else ""
    table = Table(box=box.SIMPLE_HEAD, title=f"plan for {plan.model.model} on {plan.cluster.name} "
                        f"({what}per microbatch of {plan.microbatch_size})")
    for col in ("stage", "device", "type", "nodes", "GFLOP", "params", "memory / capacity", "compute", "transfer", "time",
                "% of max"):
        table.add_column(col, justify="left" if col in ("device", "type") else "right")
    for s in plan.stages:
        table.add_row(
            str(s.index), s.device, s.device_type, str(s.node_count), f"{s.flops / 1e9:.3g}",
            format_bytes(s.param_bytes),
            f"{format_bytes(s.memory_bytes)} / {format_bytes(s.capacity_bytes)}",
            format_us(s.compute_us), format_us(transfer_us(s)), format_us(s.predicted_time_us),
            f"{share_of_bottleneck(plan, s):.0%}",
        )
    return table


def plan_summary(plan: PlanReport) -> str:
    rate = plan.predicted_samples_per_s
    return (
        f"bottleneck {format_us(plan.bottleneck_us)} per microbatch  |  "
        f"throughput {rate or 0:,.0f} samples/s  |  lower bound {format_us(plan.lower_bound_us)}  |  "
        f"gap {plan.gap:.2%}  |  solver {plan.solver_status}"
    )


def search_lines(plan: PlanReport) -> list[str]:
    """What searched for the plan, and the bounds it went without (plan.json's `bounds`)."""
    bounds = plan.bounds or {}
    lines = [f"search: {bounds['search']}"] if bounds.get("search") else []
    if missing := left_out(bounds):
        lines.append(f"bounds: {missing}")
    return lines


def baseline_lines(plan: PlanReport) -> list[str]:
    """One line per entry of plan.json's optional `baselines` ({name, bottleneck_us})."""
    lines = []
    for b in plan.baselines:
        note = f" ({b['note']})" if b.get("note") else ""
        if b.get("bottleneck_us") is None:
            lines.append(f"baseline {b['name']}: no plan{note}")
            continue
        ratio = b["bottleneck_us"] / plan.bottleneck_us if plan.bottleneck_us else float("nan")
        feasible = "" if b.get("feasible", True) else ", over memory capacity"
        if b.get("step_ratio") is not None:  # NOTE [simulated ratios] in partitioner/baselines.py
            lines.append(f"baseline {b['name']}: step {format_us(b['step_us'])} ({b['step_ratio']:.2f}x the plan's "
                         f"simulated step, bottleneck {ratio:.2f}x{feasible}){note}")
            continue
        lines.append(f"baseline {b['name']}: bottleneck {format_us(b['bottleneck_us'])} "
                     f"({ratio:.2f}x the plan's{feasible}){note}")
    return lines


def print_plan(plan: PlanReport, console: Console | None = None) -> None:
    console = console or Console()
    console.print(plan_table(plan))
    console.print(plan_summary(plan))
    step = simulated_step(plan)
    console.print(f"step of {step.microbatches} microbatches ({SCHEDULE_NAMES[step.schedule]}, simulated): "
                  f"{format_us(step.step_ns / 1000)}, "
                  f"bubble {step.bubble_fraction:.0%}", markup=False, highlight=False)
    for line in search_lines(plan):  # NOTE [what ran] in partitioner/solve.py
        console.print(line, markup=False, highlight=False)
    for line in baseline_lines(plan):
        console.print(line, markup=False, highlight=False)
    dynamic = plan.dynamic  # which dims `hetpart run --batch-size/--seq-len` may change
    if dynamic is not None:
        top = f" (2 to {dynamic['seq_len_max']})" if dynamic.get("seq_len_max") else ""
        seq = f"dynamic{top}" if dynamic["seq_len"] else f"static ({dynamic.get('why') or 'traced so'})"
        console.print(f"dynamic dims: batch; sequence length {seq}", markup=False, highlight=False)
