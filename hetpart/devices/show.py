"""`hetpart check`: a cluster as hetpart reads it, every device, every link, the totals."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from hetpart.devices.catalog import GiB
from hetpart.devices.cluster import Cluster


def print_cluster(cluster: Cluster, console: Console) -> None:
    """Tables of the devices and the links, and a line of totals (datasheet peaks)."""
    table = Table(box=box.SIMPLE_HEAD, title=f"cluster {cluster.name}: devices")
    for col in ("device", "type", "memory GiB", "fp32 TFLOP/s", "fp16/bf16 TFLOP/s", "memory GB/s"):
        table.add_column(col, justify="left" if col in ("device", "type") else "right")
    for d in cluster.devices:
        half = max(d.type.flops_per_s("fp16"), d.type.flops_per_s("bf16"))
        table.add_row(d.name, d.type.name, f"{d.mem_bytes / GiB:.4g}", f"{d.type.flops_per_s('fp32') / 1e12:g}",
                      f"{half / 1e12:g}", f"{d.type.mem_bw_bytes_per_s / 1e9:g}")
    console.print(table)
    links = Table(box=box.SIMPLE_HEAD, title="links")
    for col in ("between", "devices", "bandwidth GB/s", "latency us"):
        links.add_column(col, justify="left" if col in ("between", "devices") else "right")
    for m in cluster.machines:
        links.add_row(f"inside machine {m.name}", str(len(m.devices)), f"{m.link.bandwidth_bytes_per_s / 1e9:g}",
                      f"{m.link.latency_s * 1e6:g}")
    links.add_row("machines (network)", "", f"{cluster.network.bandwidth_bytes_per_s / 1e9:g}",
                  f"{cluster.network.latency_s * 1e6:g}")
    console.print(links)
    kinds: dict[str, int] = {}
    for d in cluster.devices:
        kinds[d.type.name] = kinds.get(d.type.name, 0) + 1
    fp32 = sum(d.type.flops_per_s("fp32") for d in cluster.devices) / 1e12
    console.print(f"{len(cluster.devices)} device(s) on {len(cluster.machines)} machine(s): "
                  + ", ".join(f"{n} x {t}" for t, n in kinds.items())
                  + f"; {sum(d.mem_bytes for d in cluster.devices) / GiB:.4g} GiB of memory, {fp32:g} TFLOP/s fp32 "
                  "(datasheet peaks; `hetpart devices` lists the catalog)", markup=False, highlight=False)
