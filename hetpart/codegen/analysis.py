"""ir/analysis.json: the lowered problem and the cluster a plan was made for (NOTE [re-plan from the stored
analysis] in hetpart/replan.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from hetpart.devices import Cluster
from hetpart.devices.catalog import DeviceType
from hetpart.devices.cluster import ClusterDevice, LinkSpec, Machine
from hetpart.partitioner import Problem
from hetpart.partitioner.problem_json import problem_to_json

ANALYSIS = "ir/analysis.json"
ANALYSIS_VERSION = 1


def cluster_to_json(cluster: Cluster) -> dict[str, Any]:
    """A cluster as JSON: its machines, links, devices (by name) and their types."""
    types = {d.type.name: dataclasses.asdict(d.type) for d in cluster.devices}
    return {"name": cluster.name, "network": dataclasses.asdict(cluster.network), "device_types": types,
            "machines": [{"name": m.name, "link": dataclasses.asdict(m.link),
                          "devices": [{"name": d.name, "type": d.type.name, "mem_bytes": d.mem_bytes, "core": d.core}
                                      for d in m.devices]} for m in cluster.machines],
            **({"memory_reserve_bytes": cluster.memory_reserve_bytes} if cluster.memory_reserve_bytes else {})}


def cluster_from_json(data: dict[str, Any]) -> Cluster:
    """The Cluster `cluster_to_json` wrote."""
    types = {name: DeviceType(**t) for name, t in data["device_types"].items()}
    return Cluster(data["name"], tuple(
        Machine(m["name"], tuple(ClusterDevice(d["name"], types[d["type"]], m["name"], d["mem_bytes"], d["core"])
                                 for d in m["devices"]), LinkSpec(**m["link"]))
        for m in data["machines"]), LinkSpec(**data["network"]), data.get("memory_reserve_bytes", 0))


def write_analysis(tmp: Path, problem: Problem, cluster: Cluster, tensor_parallel: dict | None = None) -> None:
    """ir/analysis.json in `partition`'s staging dir (NOTE [re-plan from the stored analysis] in replan.py); a plan of
    mixed tensor-parallel degrees adds its `tensor_parallel` record (NOTE [re-plan of mixed degrees] in
    replan_mixed.py)."""
    data = {"version": ANALYSIS_VERSION, "problem": problem_to_json(problem), "cluster": cluster_to_json(cluster)}
    if tensor_parallel is not None:
        data["tensor_parallel"] = tensor_parallel
    (tmp / ANALYSIS).write_text(json.dumps(data, sort_keys=True) + "\n")
