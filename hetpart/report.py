"""Plan tables for the terminal (rich), read from plan.json so `partition` and `inspect` agree."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich import box
from rich.table import Table


def _bytes(n: float) -> str:
    for factor, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= factor:
            return f"{n / factor:.3g} {unit}"
    return f"{n:.0f} B"


def _us(value: float) -> str:
    return f"{value / 1000:.3g} ms" if value >= 1000 else f"{value:.3g} us"


def plan_table(plan: dict[str, Any]) -> Table:
    bottleneck = plan["bottleneck_us"] or 1
    table = Table(box=box.SIMPLE_HEAD, title=f"plan for {plan['model']['model']} on {plan['cluster']['name']} "
                        f"(per microbatch of {plan['microbatch_size']})")
    for col in ("stage", "device", "type", "nodes", "GFLOP", "memory / capacity", "compute", "transfer", "time",
                "% of max"):
        table.add_column(col, justify="left" if col in ("device", "type") else "right")
    for s in plan["stages"]:
        share = s["predicted_time_us"] / bottleneck
        table.add_row(
            str(s["index"]), s["device"], s["device_type"], str(s["node_count"]), f"{s['flops'] / 1e9:.3g}",
            f"{_bytes(s['memory_bytes'])} / {_bytes(s['capacity_bytes'])}",
            _us(s["compute_us"]), _us(s["comm_in_us"] + s["comm_out_us"]), _us(s["predicted_time_us"]),
            f"{share:.0%}",
        )
    return table


def plan_summary(plan: dict[str, Any]) -> str:
    rate = plan.get("predicted_samples_per_s")
    return (
        f"bottleneck {_us(plan['bottleneck_us'])} per microbatch  |  "
        f"throughput {rate:,.0f} samples/s  |  lower bound {_us(plan['lower_bound_us'])}  |  "
        f"gap {plan['gap']:.2%}  |  solver {plan['solver_status']}"
    )


def print_plan(plan: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    console.print(plan_table(plan))
    console.print(plan_summary(plan))
