"""The stages of a manifest's ranks, where a rank may run several (NOTE [virtual-stage manifest] in codegen/virtual.py).

Torch-free: `load_manifest` (runtime/artifacts.py) checks a virtual-stage mesh here, and the launcher,
the workers and `shard-weights` list every stage's entry through `stage_entries`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hetpart.errors import REDO_PARTITION, HetpartError

EDITED = f"; the manifest was edited or truncated: {REDO_PARTITION}"


def rank_stage_entries(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of the stages one rank runs, in stage order: its own (first) stage, then its virtual ones."""
    first = {f: v for f, v in entry.items() if f != "virtual_stages"}
    return [first, *entry.get("virtual_stages", [])]


def stage_entries(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """Every stage's entry (dir, files, inputs, outputs, weights, the rank running it), in rank-directory order:
    the ranks' own entries, then the virtual stages' by stage (one entry per rank in a plan without them)."""
    entries = [e for entry in manifest["ranks"] for e in rank_stage_entries(entry)]
    return sorted(entries, key=lambda e: e["stage"]) if virtual_stages(manifest) > 1 else entries


def virtual_stages(manifest: dict[str, Any]) -> int:
    """v, the stages each rank runs (1 in a plan without virtual stages)."""
    mesh = manifest.get("mesh")
    return mesh.get("virtual_stages", 1) if isinstance(mesh, dict) else 1


def check_virtual_mesh(path: Path, manifest: dict[str, Any]) -> None:
    """A virtual-stage mesh and the ranks' `virtual_stages` agree (NOTE [virtual-stage manifest]): v >= 2, stage k
    on rank k mod D and nowhere else, one pipeline group of ranks 0..D-1, and each rank's groups those holding it."""
    mesh, ranks = manifest["mesh"], manifest["ranks"]
    world, v = len(ranks), mesh.get("virtual_stages")
    if not (isinstance(v, int) and not isinstance(v, bool) and v >= 2 and "pipelines" not in mesh
            and isinstance(mesh.get("groups"), list) and isinstance(mesh.get("rank_groups"), list)):
        raise HetpartError(f"{path}: mesh.virtual_stages must be an integer >= 2 in a mesh of one pipeline with "
                           f"groups and rank_groups{EDITED}")
    if mesh.get("stages") != [[k % world] for k in range(v * world)]:
        raise HetpartError(f"{path}: with mesh.virtual_stages {v}, mesh.stages must give stage k of {v * world} "
                           f"to rank k mod {world}{EDITED}")
    for r, entry in enumerate(ranks):
        others = entry.get("virtual_stages")
        if not isinstance(others, list) or [e.get("stage") if isinstance(e, dict) else None for e in others] != list(
                range(r + world, v * world, world)) or any(e.get("rank") != r for e in others):
            raise HetpartError(f"{path}: ranks[{r}].virtual_stages must be the entries of stages "
                               f"{list(range(r + world, v * world, world))}, each of rank {r}{EDITED}")
    groups = mesh["groups"]
    pipeline = [g for g in groups if isinstance(g, dict) and g.get("kind") == "pipeline"]
    if len(pipeline) != 1 or pipeline[0].get("ranks") != list(range(world)):
        raise HetpartError(f"{path}: mesh.groups needs one pipeline group of ranks 0..{world - 1}{EDITED}")
    for g in groups:
        if not (isinstance(g, dict) and isinstance(g.get("name"), str) and g.get("kind") in ("pipeline", "weights")
                and isinstance(g.get("ranks"), list) and all(isinstance(r, int) and 0 <= r < world for r in g["ranks"])
                and (g["kind"] != "weights" or isinstance(g.get("weights"), list))):
            raise HetpartError(f"{path}: mesh.groups must be named pipeline or weights groups of ranks{EDITED}")
    expected = [[g["name"] for g in groups if r in g["ranks"]] for r in range(world)]
    if mesh["rank_groups"] != expected:
        raise HetpartError(f"{path}: mesh.rank_groups must list the groups holding each rank ({expected}){EDITED}")
