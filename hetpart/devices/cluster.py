"""A cluster: devices grouped into machines ("nodes"), links inside and between them.

Loaded from TOML or a preset name:

    [network]                                        # between machines
    bandwidth_GBps = 12.5
    latency_us = 10
    [[nodes]]
    name = "a"
    devices = ["a100-80g", "a100-80g"]               # or {type = "a100-80g", mem_GiB = 40}
    link = { bandwidth_GBps = 300, latency_us = 2 }  # inside the machine

    >>> c = load_cluster("preset:mixed-4")
    >>> [d.name for d in c.devices]
    ['a/0', 'a/1', 'b/0', 'b/1']
"""

from __future__ import annotations

import math
import re
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpart.devices.catalog import CATALOG, GB, GiB, DeviceType
from hetpart.errors import HetpartError, did_you_mean


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
    core: int | None = None  # `run --emulate`: the CPU core that emulates it (NOTE [emulated devices])


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
    memory_reserve_bytes: int = 0  # NOTE [memory reserve]: already taken off every device's mem_bytes

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


def _hetero(machines_per_type: int) -> str:
    """A preset of 8-GPU machines, `machines_per_type` of each kind: H100-80G and A100-80G and
    A100-40G on NVLink, L4 on PCIe; 200 Gb/s Ethernet between machines (`count`: repeated machines)."""
    kinds = [("h", "h100-80g", 450, 2), ("a", "a100-80g", 300, 2), ("s", "a100-40g", 300, 2), ("l", "l4-24g", 25, 5)]
    nodes = "".join(f"""
        [[nodes]]
        name = "{name}"
        count = {machines_per_type}
        devices = [{", ".join([f'"{t}"'] * 8)}]
        link = {{ bandwidth_GBps = {bw}, latency_us = {lat} }}""" for name, t, bw, lat in kinds)
    return f"""
        [network]
        bandwidth_GBps = 25
        latency_us = 10{nodes}
    """


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
    # 4 x A100 on NVLink and 4 x T4 on PCIe, two machines on 100 Gb/s Ethernet.
    "a100-t4-8": """
        [network]
        bandwidth_GBps = 12.5
        latency_us = 10
        [[nodes]]
        name = "a"
        devices = ["a100-80g", "a100-80g", "a100-80g", "a100-80g"]
        link = { bandwidth_GBps = 300, latency_us = 2 }
        [[nodes]]
        name = "b"
        devices = ["t4-16g", "t4-16g", "t4-16g", "t4-16g"]
        link = { bandwidth_GBps = 16, latency_us = 5 }
    """,
    # What a spot market hands out: four machines of four types, 100 Gb/s between them.
    "spot-16": """
        [network]
        bandwidth_GBps = 12.5
        latency_us = 10
        [[nodes]]
        name = "h"
        devices = ["h100-80g", "h100-80g", "h100-80g", "h100-80g"]
        link = { bandwidth_GBps = 450, latency_us = 2 }
        [[nodes]]
        name = "a"
        devices = ["a100-40g", "a100-40g", "a100-40g", "a100-40g"]
        link = { bandwidth_GBps = 300, latency_us = 2 }
        [[nodes]]
        name = "l"
        devices = ["l4-24g", "l4-24g", "l4-24g", "l4-24g"]
        link = { bandwidth_GBps = 25, latency_us = 5 }
        [[nodes]]
        name = "t"
        devices = ["t4-16g", "t4-16g", "t4-16g", "t4-16g"]
        link = { bandwidth_GBps = 16, latency_us = 5 }
    """,
    # Mixed fleets of 8-GPU machines at scale (issue 19): a quarter each of the machines.
    "hetero-64": _hetero(2),
    "hetero-256": _hetero(8),
    "hetero-1024": _hetero(32),
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
    "cpu-4": """
        [network]
        bandwidth_GBps = 1
        latency_us = 50
        [[nodes]]
        name = "local"
        devices = ["cpu", "cpu", "cpu", "cpu"]
        link = { bandwidth_GBps = 2, latency_us = 20 }
    """,
    # Six CPU processes on this machine: room for data-parallel pipelines of different lengths (issue 19).
    "cpu-6": """
        [network]
        bandwidth_GBps = 1
        latency_us = 50
        [[nodes]]
        name = "local"
        devices = ["cpu", "cpu", "cpu", "cpu", "cpu", "cpu"]
        link = { bandwidth_GBps = 2, latency_us = 20 }
    """,
    # Eight: two data-parallel pipelines of two tensor-parallel-2 stages each (issues 19 and 20 composed).
    "cpu-8": """
        [network]
        bandwidth_GBps = 1
        latency_us = 50
        [[nodes]]
        name = "local"
        devices = ["cpu", "cpu", "cpu", "cpu", "cpu", "cpu", "cpu", "cpu"]
        link = { bandwidth_GBps = 2, latency_us = 20 }
    """,
}


class _Source:
    """Where a cluster came from, to point errors at a file and line."""

    def __init__(self, label: str, text: str) -> None:
        self.label, self.text = label, text

    def section(self, header: str, index: int) -> int:
        """Line number (1-based) of the index-th `header` line, e.g. the 2nd `[[nodes]]`; 1 if absent."""
        seen = 0
        for number, line in enumerate(self.text.splitlines(), start=1):
            if line.strip().startswith(header):
                if seen == index:
                    return number
                seen += 1
        return 1

    def error(self, message: str, needle: str | None = None, start: int = 1) -> HetpartError:
        """An error at the first line from `start` on that contains `needle` (else at the file)."""
        where = self.label
        if needle is not None:
            lines = self.text.splitlines()
            for number in list(range(start, len(lines) + 1)) + list(range(1, start)):
                if needle in lines[number - 1]:
                    where = f"{self.label}:{number}"
                    break
        return HetpartError(f"{where}: {message}")


# NOTE [cluster ranges]
# Every number of a cluster file must be finite and physically plausible: beyond these ranges
# the cost model's integer nanoseconds overflow (1e300 GB/s, 1e-300 TFLOP/s) or a typo slipped
# in (mem_GB = 80000 for 80). Values at or below 0 keep their own message ("must be a number > 0").
# Names of machines and device types land in launch.sh, hostnames and file names: they are
# NAME_PATTERN (letters, digits, '.', '_' and '-', starting with a letter or digit, at most 64),
# so no whitespace, control character, '/' or shell metacharacter gets through.
RANGES: dict[str, tuple[float, float, str]] = {
    "bandwidth_GBps": (1e-3, 1e5, "GB/s"),  # 1 MB/s to 100 TB/s
    "latency_us": (0.0, 1e6, "us"),  # up to a second
    "mem_GB": (1e-6, 1e5, "GB (10^9 bytes)"),  # 1 kB to 100 TB
    "mem_GiB": (1e-6, 1e5, "GiB (2^30 bytes)"),
    "mem": (1e3, 1e14, "bytes"),
    "mem_bw_GBps": (1e-3, 1e5, "GB/s"),
    "peak_tflops": (1e-3, 1e5, "TFLOP/s"),  # 1 GFLOP/s to 100 PFLOP/s
    "overhead_us": (0.0, 1e6, "us"),
    "matmul_efficiency": (1e-3, 1.0, "of peak"),
    "memory_efficiency": (1e-3, 1.0, "of peak"),
}
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_DEVICES = 4096  # in one cluster: the planners' tables grow with devices x stages


def _number(src: _Source, table: dict[str, Any], key: str, what: str, start: int, *, minimum: float = 0.0,
            strict: bool = True, default: float | None = None, limits: str | None = None) -> float:
    """table[key] as a finite number > minimum (or >= minimum when not strict), within
    RANGES[limits or key] (NOTE [cluster ranges])."""
    if key not in table:
        if default is not None:
            return default
        raise src.error(f"{what} needs '{key}' (a positive number)", None, start)
    value = table[key]
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value > minimum if strict else value >= minimum))
    if not ok:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise src.error(f"{what}: '{key}' must be a number {bound}, got {value!r}", key, start)
    lo, hi, unit = RANGES[limits or key]
    if not lo <= value <= hi:
        raise src.error(f"{what}: '{key}' = {value!r} is outside the range hetpart accepts, {lo:g} to {hi:g} {unit}; "
                        "check the units (see the cluster file format in the README)", key, start)
    return float(value)


def _name(src: _Source, value: Any, what: str, start: int) -> str:
    """A machine or device type name: NAME_PATTERN (NOTE [cluster ranges])."""
    if not isinstance(value, str) or not NAME_PATTERN.fullmatch(value):
        shown = (repr(value) if not isinstance(value, str) or len(value) <= 64
                 else f"{value[:40]!r}... ({len(value)} characters)")
        raise src.error(f"{what} {shown} is not a valid name: use 1 to 64 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit (no spaces, '/' or shell characters)", "name", start)
    return value


def _check_keys(src: _Source, table: dict[str, Any], allowed: set[str], what: str, start: int) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise src.error(f"{what}: unknown key(s) {unknown} (allowed: {', '.join(sorted(allowed))})", unknown[0], start)


def _link(src: _Source, table: Any, what: str, start: int) -> LinkSpec:
    if not isinstance(table, dict):
        raise src.error(f"{what} must be a table like {{ bandwidth_GBps = 300, latency_us = 2 }}", None, start)
    _check_keys(src, table, {"bandwidth_GBps", "latency_us"}, what, start)
    bw = _number(src, table, "bandwidth_GBps", what, start)
    latency = _number(src, table, "latency_us", what, start, strict=False, default=0.0)
    return LinkSpec(bandwidth_bytes_per_s=bw * GB, latency_s=latency * 1e-6)


PEAK_DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8")


def _device_type(src: _Source, entry: Any, index: int) -> DeviceType:
    """One [[device_types]] table: a custom type next to the catalog's."""
    start = src.section("[[device_types]]", index)
    what = f"[[device_types]] #{index + 1}"
    if not isinstance(entry, dict):
        raise src.error(f"{what} must be a table", None, start)
    _check_keys(src, entry, {"name", "description", "peak_tflops", *MEM_KEYS, "mem_bw_GBps", "matmul_efficiency",
                             "memory_efficiency", "overhead_us"}, what, start)
    name = entry.get("name")
    if name is None:
        raise src.error(f"{what} needs a name, e.g. name = \"my-gpu\"", None, start)
    name = _name(src, name, f"{what}: device type name", start)
    if name in CATALOG:
        raise src.error(f"device type '{name}' is already in the catalog; give your type another name", name, start)
    what = f"device type '{name}'"
    peaks = entry.get("peak_tflops")
    if not isinstance(peaks, dict) or "fp32" not in peaks:
        raise src.error(f"{what} needs peak_tflops = {{ fp32 = ..., bf16 = ... }} with at least fp32", "peak_tflops", start)
    _check_keys(src, peaks, set(PEAK_DTYPES), f"{what} peak_tflops", start)
    description = entry.get("description", "custom device type")
    if not isinstance(description, str) or not description.isprintable():
        raise src.error(f"{what}: 'description' must be a string of printable characters, got {description!r}",
                        "description", start)
    return DeviceType(
        name=name,
        description=description,
        peak_flops_per_s={k: _number(src, peaks, k, f"{what} peak_tflops", start, limits="peak_tflops") * 1e12
                          for k in peaks},
        mem_bw_bytes_per_s=_number(src, entry, "mem_bw_GBps", what, start) * GB,
        mem_bytes=_device_type_mem(src, entry, what, start),
        matmul_efficiency=_efficiency(src, entry, "matmul_efficiency", what, start, 0.7),
        memory_efficiency=_efficiency(src, entry, "memory_efficiency", what, start, 0.8),
        overhead_ns=round(_number(src, entry, "overhead_us", what, start, strict=False, default=4.0) * 1000),
    )


def _device_type_mem(src: _Source, entry: dict, what: str, start: int) -> int:
    mem = _mem_bytes(src, entry, what, start)
    if mem is None:
        raise src.error(f"{what} needs its memory: mem_GiB = 80 (2^30 bytes), mem_GB = 80 (10^9 bytes) or "
                        "mem = \"80 GiB\"", None, start)
    return mem


def _efficiency(src: _Source, entry: dict, key: str, what: str, start: int, default: float) -> float:
    value = _number(src, entry, key, what, start, default=default)
    if value > 1:
        raise src.error(f"{what}: '{key}' is a share of peak, between 0 and 1, got {value!r}", key, start)
    return value


# NOTE [memory units]
# The catalog and every table hetpart prints (`hetpart devices`, the plan table) count memory
# in GiB (2^30 bytes); a cluster file says which unit it means: `mem_GiB = 80`, `mem_GB = 85.9`
# (10^9 bytes, as disk makers count) or `mem = "80 GiB"` with a unit (B, kB, MB, GB, TB
# powers of 1000; KiB, MiB, GiB, TiB powers of 1024). One of them per table; errors name the unit.
MEM_KEYS = ("mem", "mem_GB", "mem_GiB")
MEM_UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
             "KiB": 1 << 10, "MiB": 1 << 20, "GiB": GiB, "TiB": 1 << 40}
MEM_TEXT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*")


def _mem_bytes(src: _Source, table: dict[str, Any], what: str, start: int) -> int | None:
    """The memory `table` gives (NOTE [memory units]) in bytes, None when it gives none."""
    given = [k for k in MEM_KEYS if k in table]
    if len(given) > 1:
        raise src.error(f"{what}: give its memory once, as one of mem_GiB (2^30 bytes), mem_GB (10^9 bytes) or "
                        f"mem = \"80 GiB\"; got {' and '.join(given)}", given[1], start)
    if not given:
        return None
    key = given[0]
    if key == "mem_GB":
        return int(_number(src, table, key, what, start) * GB)
    if key == "mem_GiB":
        return int(_number(src, table, key, what, start) * GiB)
    text = table[key]
    m = MEM_TEXT.fullmatch(text) if isinstance(text, str) else None
    if m is None or m.group(2) not in MEM_UNITS:
        raise src.error(f"{what}: 'mem' must be a size with a unit, like \"80 GiB\" (2^30 bytes) or \"40 GB\" (10^9 "
                        f"bytes; units: {', '.join(MEM_UNITS)}), got {text!r}", key, start)
    nbytes = float(m.group(1)) * MEM_UNITS[m.group(2)]
    lo, hi, _ = RANGES["mem"]
    if not lo <= nbytes <= hi:
        raise src.error(f"{what}: 'mem' = {text!r} is outside the range hetpart accepts, 1 kB to 100 TB; check the "
                        "unit (see the cluster file format in the README)", key, start)
    return int(nbytes)


def _device(src: _Source, entry: Any, machine: str, index: int, types: dict[str, DeviceType],
            start: int) -> ClusterDevice:
    mem_override, core = None, None
    if isinstance(entry, dict):
        if set(entry) - {"type", "core", *MEM_KEYS} or "type" not in entry:
            raise src.error(
                f"node '{machine}': a device is a type name or {{type = \"a100-80g\", mem_GiB = 40}} (or mem_GB = 40 "
                f"for 10^9 bytes, or mem = \"40 GiB\") and `core = N` for `run --emulate`, got {entry!r}",
                "devices", start,
            )
        mem_override = _mem_bytes(src, entry, f"node '{machine}' device {index}", start)
        if "core" in entry:  # NOTE [emulated devices] in hetpart/runtime/emulate.py
            core = entry["core"]
            if isinstance(core, bool) or not isinstance(core, int) or core < 0:
                raise src.error(f"node '{machine}' device {index}: 'core' is a CPU core number >= 0 (for "
                                f"`run --emulate`), got {core!r}", "core", start)
        entry = entry["type"]
    if not isinstance(entry, str):
        raise src.error(f"node '{machine}': a device must be a type name string, got {entry!r}", "devices", start)
    if entry not in types:
        raise src.error(f"unknown device type '{entry}' (known: {', '.join(sorted(types))}; "
                        f"or define it in a [[device_types]] table){did_you_mean(entry, types)}", f'"{entry}"', start)
    dtype = types[entry]
    mem = mem_override if mem_override is not None else dtype.mem_bytes
    return ClusterDevice(name=f"{machine}/{index}", type=dtype, machine=machine, mem_bytes=mem, core=core)


def _deepest_line(text: str) -> int:
    """The line (1-based) where brackets outside strings and comments first nest 32 deep (an
    approximation of TOML's grammar, only used to point at a file too deeply nested to parse)."""
    depth, quote, line = 0, None, 1
    chars = iter(text)
    for ch in chars:
        if ch == "\n":
            line += 1
            if quote is not None and len(quote) == 1:
                quote = None
        elif quote is not None:
            if ch == "\\" and quote == '"':
                next(chars, None)
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            for ch2 in chars:
                if ch2 == "\n":
                    line += 1
                    break
        elif ch in "[{":
            depth += 1
            if depth >= 32:
                return line
        elif ch in "]}":
            depth -= 1
    return line


# NOTE [repeated machines]
# A fleet of 128 identical 8-GPU machines is one table, not 128: `count = N` in a [[nodes]] table
# makes N machines of its devices and link, named <name>-0 .. <name>-(N-1) (so their devices are
# <name>-0/0, ...). N is a whole number from 1 to MAX_DEVICES; the cluster's total, counts
# included, stays within MAX_DEVICES, and no machine may take another node's name.
def _count(src: _Source, node: Any, start: int) -> int:
    """A [[nodes]] table's `count` (NOTE [repeated machines]); 1 when absent or not a table."""
    if not isinstance(node, dict) or "count" not in node:
        return 1
    value = node["count"]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DEVICES:
        raise src.error(f"node '{node.get('name', '?')}': 'count' is how many such machines there are, a whole number "
                        f"from 1 to {MAX_DEVICES}, got {value!r}", "count", start)
    return value


def parse_cluster(text: str, label: str, name: str) -> Cluster:
    """A Cluster from TOML text; errors name `label`, the line, and what is allowed."""
    src = _Source(label, text)
    try:
        data = tomllib.loads(text)
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise HetpartError(f"{label}:{_deepest_line(text)}: arrays or tables nested too deeply to read (a cluster "
                           "file nests at most 3 levels); see the cluster file format in the README") from None
    except tomllib.TOMLDecodeError as err:  # "... (at line 3, column 5)" or "... (at end of document)"
        at = re.search(r" \(at line (\d+), column (\d+)\)$", str(err))
        line = f"{at.group(1)}:{at.group(2)}" if at else str(len(text.splitlines()) or 1)
        what = str(err)[:at.start()] if at else str(err).removesuffix(" (at end of document)")
        raise HetpartError(f"{label}:{line}: not valid TOML: {what}; see the cluster file format in the README") from None
    _check_keys(src, data, {"network", "nodes", "device_types"}, "cluster", 1)
    custom = data.get("device_types", [])
    if not isinstance(custom, list):
        raise src.error("device_types must be an array of tables: [[device_types]]", "device_types")
    types = dict(CATALOG)
    for i, entry in enumerate(custom):
        t = _device_type(src, entry, i)
        if t.name in types:
            raise src.error(f"device type '{t.name}' is defined twice", t.name, src.section("[[device_types]]", i))
        types[t.name] = t
    nodes = data.get("nodes")
    if nodes is not None and (not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes)):
        raise src.error("nodes must be an array of tables, one [[nodes]] per machine (see the cluster file "
                        "format in the README)", "nodes")
    if not nodes:
        raise src.error("the cluster has no [[nodes]]; add at least one node with devices")
    counts = [_count(src, node, src.section("[[nodes]]", i)) for i, node in enumerate(nodes)]
    total = sum(len(n["devices"]) * k for n, k in zip(nodes, counts) if isinstance(n.get("devices"), list))
    if total > MAX_DEVICES:
        raise src.error(f"the cluster has {total} devices; hetpart plans at most {MAX_DEVICES} (a pipeline has a "
                        "stage per device it uses): list the machines you mean to use")
    machines = []
    seen: set[str] = set()
    for i, node in enumerate(nodes):
        start = src.section("[[nodes]]", i)
        mname = _name(src, node.get("name", f"node{i}"), "node name", start)
        if mname in seen:
            raise src.error(f"node name '{mname}' is used twice", f'"{mname}"', start)
        seen.add(mname)
        _check_keys(src, node, {"name", "count", "devices", "link"}, f"node '{mname}'", start)
        devices = node.get("devices")
        if not isinstance(devices, list) or not devices:
            raise src.error(f"node '{mname}' has no devices; list them as devices = [\"a100-80g\", ...]",
                            "devices", start)
        link = _link(src, node.get("link", {"bandwidth_GBps": 300, "latency_us": 2}), f"node '{mname}' link", start)
        first = Machine(mname, tuple(_device(src, d, mname, j, types, start) for j, d in enumerate(devices)), link)
        if "count" not in node:
            machines.append(first)
            continue
        # `count` machines named <name>-0, <name>-1, ... (NOTE [repeated machines]).
        if len(f"{mname}-{counts[i] - 1}") > 64:
            raise src.error(f"node '{mname}' with count = {counts[i]}: its machines' names <name>-<index> would be "
                            "longer than 64 characters; shorten the name", f'"{mname}"', start)
        for r in range(counts[i]):
            rname = f"{mname}-{r}"
            machines.append(Machine(rname, tuple(ClusterDevice(f"{rname}/{j}", d.type, rname, d.mem_bytes, d.core)
                                                 for j, d in enumerate(first.devices)), link))
    twice = [n for n, k in Counter(m.name for m in machines).items() if k > 1]
    if twice:
        raise src.error(f"machine name '{twice[0]}' is used twice: a node with `count` names its machines "
                        "<name>-0, <name>-1, ...; rename one of them", f'"{twice[0].rsplit("-", 1)[0]}"')
    network = _link(src, data.get("network", {"bandwidth_GBps": 12.5, "latency_us": 10}), "[network]",
                    src.section("[network]", 0))
    return Cluster(name=name, machines=tuple(machines), network=network)


# NOTE [memory reserve]
# `partition --memory-reserve GIB` plans with GIB of every device's memory left free, for what the cost model does
# not count (NOTE [memory the runtime adds] in report/table.py: the CUDA context, NCCL's buffers, the allocator's
# slack, the backward's temporaries). `with_reserve` takes it off each device's `mem_bytes` once, when the cluster is
# loaded, and records it on the Cluster, so everything downstream (the check before the trace excepted: it only
# refuses what cannot fit at all) plans, bounds and prints against the memory left; plan.json's cluster record
# and ir/analysis.json carry it. A re-plan keeps it: devices of the old cluster already have it taken off, and the
# devices it brings (`--add`, `--cluster`) get it taken off in `replan.new_cluster`.


def with_reserve(cluster: Cluster, reserve_bytes: int, fresh: set[str] | None = None) -> Cluster:
    """NOTE [memory reserve]: `cluster` with `reserve_bytes` taken off the memory of its devices (of those named in
    `fresh`, where given: the others have it off already), and recorded."""
    if reserve_bytes <= 0:
        return cluster
    short = [d for d in cluster.devices if (fresh is None or d.name in fresh) and d.mem_bytes <= reserve_bytes]
    if short:
        d = short[0]
        raise HetpartError(f"--memory-reserve {reserve_bytes / GiB:g} GiB: device {d.name} ({d.type.name}) has "
                           f"{d.mem_bytes / GiB:.4g} GiB in all, nothing would be left to plan on; reserve less")
    machines = tuple(Machine(m.name, tuple(
        ClusterDevice(d.name, d.type, d.machine, d.mem_bytes - reserve_bytes, d.core)
        if fresh is None or d.name in fresh else d for d in m.devices), m.link) for m in cluster.machines)
    return Cluster(cluster.name, machines, cluster.network, reserve_bytes)


def load_cluster(spec: str) -> Cluster:
    """`preset:NAME` or a path to a TOML file."""
    if spec.startswith("preset:"):
        name = spec.removeprefix("preset:")
        if name not in PRESETS:
            raise HetpartError(f"unknown cluster preset '{name}' (known: {', '.join(sorted(PRESETS))})"
                               f"{did_you_mean(name, PRESETS, 'preset:')}")
        return parse_cluster(PRESETS[name], f"preset:{name}", name)
    if not spec.strip():
        raise HetpartError(f"--cluster is empty; give a TOML file or preset:NAME "
                           f"(presets: {', '.join(sorted(PRESETS))})")
    path = Path(spec)
    if path.is_dir():
        raise HetpartError(f"cluster file '{spec}' is a directory; give a TOML file or preset:NAME "
                           f"(presets: {', '.join(sorted(PRESETS))})")
    if not path.is_file():
        raise HetpartError(
            f"cluster file '{spec}' not found; give a TOML file or preset:NAME "
            f"(presets: {', '.join(sorted(PRESETS))})"
        )
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise HetpartError(f"cannot read cluster file '{spec}': {err}; a cluster file is UTF-8 TOML") from None
    return parse_cluster(text, str(path), path.stem)
