"""A cluster: devices grouped into machines ("nodes"), links inside and between them.

Loaded from TOML or a preset name:

    [network]                                        # between machines
    bandwidth_GBps = 12.5
    latency_us = 10
    [[nodes]]
    name = "a"
    devices = ["a100-80g", "a100-80g"]               # or {type = "a100-80g", mem_GB = 40}
    link = { bandwidth_GBps = 300, latency_us = 2 }  # inside the machine

    >>> c = load_cluster("preset:mixed-4")
    >>> [d.name for d in c.devices]
    ['a/0', 'a/1', 'b/0', 'b/1']
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpart.devices.catalog import CATALOG, GB, DeviceType
from hetpart.errors import HetpartError


@dataclass(frozen=True)
class LinkSpec:
    bandwidth_bytes_per_s: float
    latency_s: float


@dataclass(frozen=True)
class ClusterDevice:
    name: str  # "<machine>/<index>"
    type: DeviceType
    machine: str
    mem_bytes: int  # the type's capacity unless the cluster file overrides it


@dataclass(frozen=True)
class Machine:
    name: str
    devices: tuple[ClusterDevice, ...]
    link: LinkSpec


@dataclass(frozen=True)
class Cluster:
    name: str
    machines: tuple[Machine, ...]
    network: LinkSpec

    @property
    def devices(self) -> list[ClusterDevice]:
        return [d for m in self.machines for d in m.devices]

    @property
    def device_types(self) -> dict[str, DeviceType]:
        return {d.type.name: d.type for d in self.devices}

    def link(self, a: ClusterDevice, b: ClusterDevice) -> LinkSpec:
        if a.machine == b.machine:
            return next(m.link for m in self.machines if m.name == a.machine)
        return self.network


PRESETS: dict[str, str] = {
    # 2 x A100 on NVLink in one machine, 2 x T4 on PCIe in another, 100 Gb/s Ethernet between.
    "mixed-4": """
        [network]
        bandwidth_GBps = 12.5
        latency_us = 10
        [[nodes]]
        name = "a"
        devices = ["a100-80g", "a100-80g"]
        link = { bandwidth_GBps = 300, latency_us = 2 }
        [[nodes]]
        name = "b"
        devices = ["t4-16g", "t4-16g"]
        link = { bandwidth_GBps = 16, latency_us = 5 }
    """,
    # Two CPU processes on this machine, talking over loopback (for measuring here).
    "cpu-2": """
        [network]
        bandwidth_GBps = 1
        latency_us = 50
        [[nodes]]
        name = "local"
        devices = ["cpu", "cpu"]
        link = { bandwidth_GBps = 2, latency_us = 20 }
    """,
}


class _Source:
    """Where a cluster came from, to point errors at a file and line."""

    def __init__(self, label: str, text: str) -> None:
        self.label, self.text = label, text

    def error(self, message: str, needle: str | None = None) -> HetpartError:
        where = self.label
        if needle is not None:
            for number, line in enumerate(self.text.splitlines(), start=1):
                if needle in line:
                    where = f"{self.label}:{number}"
                    break
        return HetpartError(f"{where}: {message}")


def _positive(src: _Source, table: dict[str, Any], key: str, what: str) -> float:
    if key not in table:
        raise src.error(f"{what} needs '{key}' (a positive number)", what.split()[-1])
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise src.error(f"{what}: '{key}' must be a positive number, got {value!r}", key)
    return float(value)


def _link(src: _Source, table: Any, what: str) -> LinkSpec:
    if not isinstance(table, dict):
        raise src.error(f"{what} must be a table like {{ bandwidth_GBps = 300, latency_us = 2 }}", what)
    unknown = set(table) - {"bandwidth_GBps", "latency_us"}
    if unknown:
        raise src.error(f"{what}: unknown key(s) {sorted(unknown)} (allowed: bandwidth_GBps, latency_us)", sorted(unknown)[0])
    bw = _positive(src, table, "bandwidth_GBps", what)
    latency = table.get("latency_us", 0)
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or latency < 0:
        raise src.error(f"{what}: 'latency_us' must be a number >= 0, got {latency!r}", "latency_us")
    return LinkSpec(bandwidth_bytes_per_s=bw * GB, latency_s=latency * 1e-6)


def _device(src: _Source, entry: Any, machine: str, index: int) -> ClusterDevice:
    mem_override = None
    if isinstance(entry, dict):
        unknown = set(entry) - {"type", "mem_GB"}
        if unknown or "type" not in entry:
            raise src.error(
                f"node '{machine}': a device is a type name or {{type = \"a100-80g\", mem_GB = 40}}, got {entry!r}",
                machine,
            )
        if "mem_GB" in entry:
            mem_override = _positive(src, entry, "mem_GB", f"node '{machine}' device")
        entry = entry["type"]
    if not isinstance(entry, str):
        raise src.error(f"node '{machine}': device must be a type name string, got {entry!r}", machine)
    if entry not in CATALOG:
        raise src.error(
            f"unknown device type '{entry}' (known: {', '.join(sorted(CATALOG))})", f'"{entry}"'
        )
    dtype = CATALOG[entry]
    mem = int(mem_override * GB) if mem_override is not None else dtype.mem_bytes
    return ClusterDevice(name=f"{machine}/{index}", type=dtype, machine=machine, mem_bytes=mem)


def parse_cluster(text: str, label: str, name: str) -> Cluster:
    src = _Source(label, text)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise HetpartError(f"{label}: not valid TOML: {err}") from None
    unknown = set(data) - {"network", "nodes"}
    if unknown:
        raise src.error(f"unknown top-level key(s) {sorted(unknown)} (allowed: network, nodes)", sorted(unknown)[0])
    nodes = data.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise src.error("the cluster has no [[nodes]]; add at least one node with devices")
    machines = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        mname = node.get("name", f"node{i}")
        if not isinstance(mname, str) or not mname or "/" in mname:
            raise src.error(f"node name must be a non-empty string without '/', got {mname!r}", "name")
        if mname in seen:
            raise src.error(f"node name '{mname}' is used twice", f'"{mname}"')
        seen.add(mname)
        unknown = set(node) - {"name", "devices", "link"}
        if unknown:
            raise src.error(f"node '{mname}': unknown key(s) {sorted(unknown)} (allowed: name, devices, link)", sorted(unknown)[0])
        devices = node.get("devices")
        if not isinstance(devices, list) or not devices:
            raise src.error(f"node '{mname}' has no devices; list them as devices = [\"a100-80g\", ...]", f'"{mname}"')
        link = _link(src, node.get("link", {"bandwidth_GBps": 300, "latency_us": 2}), f"node '{mname}' link")
        machines.append(
            Machine(mname, tuple(_device(src, d, mname, j) for j, d in enumerate(devices)), link)
        )
    network = _link(src, data.get("network", {"bandwidth_GBps": 12.5, "latency_us": 10}), "[network]")
    return Cluster(name=name, machines=tuple(machines), network=network)


def load_cluster(spec: str) -> Cluster:
    """`preset:NAME` or a path to a TOML file."""
    if spec.startswith("preset:"):
        name = spec.removeprefix("preset:")
        if name not in PRESETS:
            raise HetpartError(f"unknown cluster preset '{name}' (known: {', '.join(sorted(PRESETS))})")
        return parse_cluster(PRESETS[name], f"preset:{name}", name)
    path = Path(spec)
    if not path.is_file():
        raise HetpartError(
            f"cluster file '{spec}' not found; give a TOML file or preset:NAME "
            f"(presets: {', '.join(sorted(PRESETS))})"
        )
    return parse_cluster(path.read_text(), str(path), path.stem)
