"""Plan tables for the terminal (rich), read from plan.json (a `PlanReport`) so `partition` and `inspect` agree."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from hetpart.partitioner.bounds import left_out
from hetpart.partitioner.simulate import Timeline, simulate
from hetpart.plan_report import PlanReport, StageReport, bound_record_errors, simulation_inputs
from hetpart.units import format_bytes, format_rate


SCHEDULE_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B",
                  "interleaved-zb": "interleaved zero bubble"}


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
    ranks = len(stages) // (plan.virtual_stages or 1)  # several stages per rank: NOTE [virtual-stage schedules]
    forward, transfer, backward = simulation_inputs(stages, all(s.backward_us is not None for s in stages))
    return simulate(forward, transfer, plan.microbatches, plan.schedule, backward_ns=backward, ranks=ranks)


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
        f"throughput {format_rate(rate)} samples/s  |  lower bound {format_us(plan.lower_bound_us)}  |  "
        f"gap {plan.gap:.2%}  |  solver {plan.solver_status}"
    )


def search_lines(plan: PlanReport) -> list[str]:
    """What searched for the plan, and the bounds it went without (plan.json's `bounds`)."""
    bounds = plan.bounds or {}
    of = f" (of {bounds['problem']}, whose bound is the plan's)" if bounds.get("problem") else ""
    lines = [f"search{of}: {bounds['search']}"] if bounds.get("search") else []
    if plan.bound_problems:  # NOTE [bound over a union] in partitioner/tp_choice.py
        lines.append("lower bound: the least of " + ", ".join(
            f"{p['problem']} {p['lower_bound_us']:,.1f} us" + (" (taken)" if p["taken"] else "")
            for p in plan.bound_problems if p["lower_bound_us"] is not None))
        lines += [f"warning: plan.json's bound fields disagree: {e}" for e in bound_record_errors(plan.to_json())]
    if missing := left_out(bounds):
        lines.append(f"bounds: {missing}")
    return lines


def baseline_lines(plan: PlanReport) -> list[str]:
    """One line per entry of plan.json's optional `baselines` ({name, bottleneck_us})."""
    lines = []
    for b in plan.baselines:
        note = f" ({b['note']})" if b.get("note") else ""
        if b.get("bottleneck_us", b.get("iteration_us")) is None:
            lines.append(f"baseline {b['name']}: no plan{note}")
            continue
        if "iteration_us" in b:  # beside data-parallel pipelines: their step (NOTE [pipeline baselines])
            ratio = b["iteration_us"] / plan.iteration_us if plan.iteration_us else float("nan")
            lines.append(f"baseline {b['name']}: iteration {format_us(b['iteration_us'])} ({ratio:.2f}x the plan's)")
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


def pipelines_table(plan: PlanReport) -> Table:
    """Several data-parallel pipelines side by side: a row per stage index, three columns per pipeline."""
    pipelines = plan.pipelines or []
    what = f"training with {SCHEDULE_NAMES.get(plan.schedule, plan.schedule)}, " if plan.training else ""
    table = Table(box=box.SIMPLE_HEAD, title=f"plan for {plan.model.model} on {plan.cluster.name}: {len(pipelines)} "
                        f"data-parallel pipeline{'s' if len(pipelines) != 1 else ''} ({what}per microbatch of {plan.microbatch_size})")
    table.add_column("stage", justify="right")
    for q in pipelines:
        table.add_column(f"pipeline {q.index} ({q.microbatches} mb)", justify="left")
        table.add_column("time", justify="right")
        table.add_column("memory / capacity", justify="right")
    for k in range(max(len(q.stages) for q in pipelines)):
        row = [str(k)]
        for q in pipelines:
            s = q.stages[k] if k < len(q.stages) else None
            row += ([f"{s.device} ({s.device_type})", f"{format_us(s.predicted_time_us)} "
                     f"{s.predicted_time_us / (q.bottleneck_us or 1):.0%}",
                     f"{format_bytes(s.memory_bytes)} / {format_bytes(s.capacity_bytes)}"] if s else ["", "", ""])
        table.add_row(*row)
    return table


def pipelines_lines(plan: PlanReport) -> list[str]:
    """Each pipeline's share and time, the step (slowest pipeline + gradient sync), and why a device is idle."""
    lines = [f"pipeline {q.index}: {len(q.stages)} stage(s), {q.microbatches} microbatch(es) of the "
             f"{plan.microbatches}, bottleneck {format_us(q.bottleneck_us)}, its share takes {format_us(q.time_us)} "
             f"(solver {q.solver_status}" + (", no bound of its own)" if q.lower_bound_us is None else ")")
             for q in plan.pipelines or []]
    slowest = max(q.time_us for q in plan.pipelines or [])
    sync = (f" + gradient sync {format_us(plan.grad_sync_us or 0)} ({format_us(plan.grad_sync_overlapped_us or 0)} "
            "left if overlapped with the backward)") if plan.training else ""
    lines.append(f"iteration {format_us(plan.iteration_us or 0)} = slowest pipeline {format_us(slowest)}{sync}")
    lines.append(f"throughput {format_rate(plan.predicted_samples_per_s)} samples/s  |  lower bound "
                 f"{format_us(plan.lower_bound_us)}  |  gap {plan.gap:.2%}  |  solver {plan.solver_status}")
    if plan.bound_note and plan.solver_status != "OPTIMAL":  # what the gap is measured against, cuts included
        lines.append(f"lower bound: {plan.bound_note}")
    lines += idle_lines(plan.devices_idle or {})
    return lines + baseline_lines(plan)


def idle_lines(devices_idle: dict[str, str]) -> list[str]:
    """One line per reason (NOTE [idle reasons]), naming the devices that share it: a machine kind's devices
    usually do (16 L4s, one reason), and the reason carries the numbers."""
    by_reason: dict[str, list[str]] = {}
    for device, why in devices_idle.items():
        by_reason.setdefault(why, []).append(device)
    out = []
    for why, devices in by_reason.items():
        names = ", ".join(devices) if len(devices) <= 4 else f"{devices[0]} ... {devices[-1]} ({len(devices)} devices)"
        out.append(f"idle: {names}: {why}")
    return out


# NOTE [memory the runtime adds]
# A stage's memory is what the cost model counts (NOTE [training memory]): weights, gradients, optimizer state
# and the stashed activations. A process holds more: the CUDA context, NCCL's buffers, the caching
# allocator's slack, the backward's temporaries (measured on this CPU: a one-microbatch step's peak up to 1.25x
# the activation term on the zoo's transformers and conv nets; 10x on a tiny MLP, whose step is mostly fixed
# overhead; docs/benchmarks.md "actmem"). The planner may fill a device to its last byte (llama-70b
# on preset:hetero-64 planned a100-40g stages at 99.9%), so a stage above TIGHT_MEMORY of its device is named
# with the ways to plan with room (NOTE [memory reserve]); the plan itself is the cost model's and is not changed.
TIGHT_MEMORY = 0.95


def memory_note(plan: PlanReport) -> str | None:
    """NOTE [memory the runtime adds]: the stages above TIGHT_MEMORY of their device's memory, or None."""
    tight = [s for s in plan.stages if s.capacity_bytes and s.memory_bytes > TIGHT_MEMORY * s.capacity_bytes]
    if not tight:
        return None
    worst = max(tight, key=lambda s: s.memory_bytes / s.capacity_bytes)
    types = sorted({s.device_type for s in tight})
    return (f"note: {len(tight)} stage(s) on {', '.join(types)} plan over {TIGHT_MEMORY:.0%} of their device's "
            f"memory (stage {worst.index} on {worst.device}: {worst.memory_bytes / worst.capacity_bytes:.1%} of its "
            f"{format_bytes(worst.capacity_bytes)}); hetpart counts weights, gradients, optimizer state and stashed "
            "activations, not the CUDA context, NCCL's buffers, the allocator's slack or the backward's "
            "temporaries: to plan with room, pass --memory-reserve GIB (every device) or give those devices less "
            "memory in a cluster file (`mem_GiB`, docs/devices.md)")


def print_plan(plan: PlanReport, console: Console | None = None) -> None:
    console = console or Console()
    note = memory_note(plan)  # NOTE [memory the runtime adds]
    if plan.pipelines:  # several data-parallel pipelines (issue 19)
        console.print(pipelines_table(plan))
        for line in pipelines_lines(plan) + ([note] if note else []):
            console.print(line, markup=False, highlight=False)
        return
    console.print(plan_table(plan))
    console.print(plan_summary(plan))
    step = simulated_step(plan)
    console.print(f"step of {step.microbatches} microbatches ({SCHEDULE_NAMES[step.schedule]}, simulated): "
                  f"{format_us(step.step_ns / 1000)}, "
                  f"bubble {step.bubble_fraction:.0%}", markup=False, highlight=False)
    for line in search_lines(plan):  # NOTE [what ran] in partitioner/solve.py
        console.print(line, markup=False, highlight=False)
    for line in baseline_lines(plan) + ([note] if note else []):
        console.print(line, markup=False, highlight=False)
    dynamic = plan.dynamic  # which dims `hetpart run --batch-size/--seq-len` may change
    if dynamic is not None:
        top = f" (2 to {dynamic['seq_len_max']})" if dynamic.get("seq_len_max") else ""
        seq = f"dynamic{top}" if dynamic["seq_len"] else f"static ({dynamic.get('why') or 'traced so'})"
        console.print(f"dynamic dims: batch; sequence length {seq}", markup=False, highlight=False)
