"""A tensor-parallel rank at run time: its TP group, its lane of the pipeline, gathered shards for --verify.

NOTE [tensor-parallel stages] in codegen/tp.py says what each rank runs; the manifest's
`mesh.tensor_parallel` records each stage's TP group (ranks, degree, each split weight's dim
and parts), which `check_tp_mesh` checks before any rank starts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetpart.errors import REDO_PARTITION, HetpartError
from hetpart.shards import WeightShard, unshard_tensor

EDITED = f"; the manifest was edited or is damaged: {REDO_PARTITION}"


def is_tp(manifest: dict[str, Any]) -> bool:
    """Whether the plan runs tensor-parallel stages."""
    return "tensor_parallel" in manifest["mesh"]


def tp_degrees(manifest: dict[str, Any]) -> list[int]:
    """The TP degrees of the plan's stages, each once, in order (none: a plan without TP stages)."""
    return sorted({entry["degree"] for entry in manifest["mesh"].get("tensor_parallel") or ()})


def is_mixed(manifest: dict[str, Any]) -> bool:
    """Whether the plan's TP stages have different degrees, their boundaries between the stages' leaders only
    (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py: the mesh's `tp_boundaries` is then "leaders",
    `check_tp_mesh` checks); otherwise each TP index has its lane. The one test of it: launcher, worker, replan."""
    return len(tp_degrees(manifest)) > 1


def check_tp_mesh(path: Path, mesh: dict[str, Any], ranks: list[dict[str, Any]], version: int | None = None) -> None:
    """A TP mesh (NOTE [tensor-parallel stages]): stage k's ranks are its TP group, consecutive ranks; with one
    degree, one pipeline group per TP index holding that index of every stage; with `tp_boundaries` "leaders"
    (format version 3: NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py) one pipeline group of every stage's
    TP rank 0 and a TP group per stage of degree > 1; several data-parallel pipelines (NOTE [tensor-parallel
    pipelines mesh] in codegen/tp.py) each their own lanes; a TP entry per stage with its weights' split dims, each
    rank's `tp` place, and with lanes each weights group the ranks of one TP index holding its weights. Raises
    naming the first disagreement."""
    from hetpart.trust import MIXED_FORMAT_VERSION

    groups, tp, several = mesh.get("groups"), mesh.get("tensor_parallel"), "pipelines" in mesh
    leaders = mesh.get("tp_boundaries") == "leaders"
    if mesh.get("tp_boundaries", "lanes") not in ("lanes", "leaders") or (
            version is not None and leaders != (version == MIXED_FORMAT_VERSION)):
        raise HetpartError(f"{path}: mesh.tp_boundaries is 'leaders' exactly in a manifest of format version "
                           f"{MIXED_FORMAT_VERSION}{EDITED}")
    if several:  # NOTE [tensor-parallel pipelines mesh]: each pipeline's batch share checked as without TP
        from hetpart.runtime.artifacts import _mesh_pipelines

        # with leaders (NOTE [mixed-degree pipelines mesh]) each pipeline names its one group, else its lanes
        pipelines = [stages for _, stages in _mesh_pipelines(path, mesh, ranks, lanes=not leaders)]
    else:
        pipelines = [mesh.get("stages")]
    stages = [s for q in pipelines if isinstance(q, list) for s in q]
    if not (all(isinstance(q, list) and q for q in pipelines) and isinstance(groups, list) and isinstance(tp, list)
            and all(isinstance(s, list) and s for s in stages)):
        raise HetpartError(f"{path}: a tensor-parallel mesh needs stages, groups and tensor_parallel{EDITED}")
    degrees = [len(s) for s in stages]
    first = [sum(degrees[:k]) for k in range(len(stages))]
    if [s for s in stages] != [list(range(f, f + d)) for f, d in zip(first, degrees)] or sum(degrees) != len(ranks) or (
            not leaders and len(set(degrees)) > 1) or (leaders and len(set(degrees)) == 1):
        raise HetpartError(f"{path}: mesh.stages must give each stage its ranks in order, every rank once, "
                           f"{'of different degrees' if leaders else 'all of one degree'}{EDITED}")
    by_name = {g["name"]: g for g in groups if isinstance(g, dict) and isinstance(g.get("name"), str)}
    if len(by_name) != len(groups) or any(g.get("kind") not in ("pipeline", "tp", "weights") for g in groups):
        raise HetpartError(f"{path}: mesh.groups must be uniquely named pipeline, tp or weights groups{EDITED}")
    if leaders and several:
        lanes = {q["group"]: [s[0] for s in q["stages"]] for q in mesh["pipelines"]}
    elif leaders:
        lanes = {"pipeline": [s[0] for s in stages]}
    elif several:
        lanes = {name: [s[j] for s in q["stages"]] for q in mesh["pipelines"]
                 for j, name in enumerate(q["lanes"] if len(q["lanes"]) == degrees[0] else ())}
    else:
        lanes = {f"pipeline-tp{j}": [s[j] for s in stages] for j in range(degrees[0])}
    for name, want in lanes.items():
        lane = by_name.get(name)
        if lane is None or lane.get("kind") != "pipeline" or lane.get("ranks") != want:
            raise HetpartError(f"{path}: mesh.groups needs {name} holding ranks {want}{EDITED}")
    if sum(g.get("kind") == "pipeline" for g in groups) != len(lanes) or len(lanes) != len(pipelines) * (
            1 if leaders else degrees[0]):
        raise HetpartError(f"{path}: mesh.groups has a pipeline group the stages do not explain, or a pipeline "
                           f"lacks a lane{EDITED}")
    if len(tp) != len(stages):
        raise HetpartError(f"{path}: mesh.tensor_parallel needs one entry per stage{EDITED}")
    places = [(p, k) for p, q in enumerate(pipelines) for k in range(len(q))]
    for i, (entry, s, (p, k)) in enumerate(zip(tp, stages, places)):
        name = entry.get("group") if isinstance(entry, dict) else None
        group = by_name.get(name)
        weights = entry.get("weights") if isinstance(entry, dict) else None
        alone = leaders and len(s) == 1  # a stage of degree 1 beside TP stages: no TP group, nothing split
        of = f" of pipeline {p}" if several else ""
        if ((group is None or group.get("kind") != "tp" or group.get("ranks") != s) if not alone else (
                name is not None or weights != {})) or entry.get("ranks") != s or entry.get("stage") != k \
                or entry.get("pipeline") != (p if several else None) \
                or entry.get("degree") != len(s) or not isinstance(weights, dict) \
                or not all(isinstance(w, dict) and isinstance(w.get("dim"), int) and w["dim"] >= 0
                           and isinstance(w.get("chunks"), int) and w["chunks"] >= 1 for w in weights.values()):
            raise HetpartError(f"{path}: mesh.tensor_parallel[{i}] must be stage {k}{of}'s TP group (its ranks {s}, "
                               f"degree {len(s)}, {'no group, nothing split' if alone else 'a tp group'}) with each "
                               f"split weight's dim and chunks{EDITED}")
        for r in s:
            place = ranks[r].get("tp")
            if place != {"rank": s.index(r), "degree": len(s), "group": name} or ranks[r]["stage"] != k or (
                    several and ranks[r].get("pipeline") != p):
                raise HetpartError(f"{path}: ranks[{r}].tp must be TP rank {s.index(r)} of {len(s)} in "
                                   f"{name}, running stage {k}{of}{EDITED}")
            unknown = sorted(set(weights) - set(ranks[r]["weights"]))
            if unknown:
                raise HetpartError(f"{path}: mesh.tensor_parallel[{i}] splits {unknown[:3]}, which rank {r} does "
                                   f"not hold{EDITED}")
    if sum(g.get("kind") == "tp" for g in groups) != sum(len(s) > 1 for s in stages):
        raise HetpartError(f"{path}: mesh.groups has a tp group no stage runs on{EDITED}")
    if not leaders:
        _check_lane_weights(path, [g for g in groups if g.get("kind") == "weights"], ranks)
    else:
        _check_slice_weights(path, [g for g in groups if g.get("kind") == "weights"], ranks, tp)
    expected = [[g["name"] for g in groups if r in g.get("ranks", [])] for r in range(len(ranks))]
    if mesh.get("rank_groups") != expected:
        raise HetpartError(f"{path}: mesh.rank_groups must list the groups holding each rank ({expected}){EDITED}")


def _check_lane_weights(path: Path, groups: list[dict[str, Any]], ranks: list[dict[str, Any]]) -> None:
    """NOTE [tensor-parallel pipelines mesh]: every weight that several ranks of one TP index hold (shard j of a
    split weight, or lane j's copy of a replicated one) is summed over exactly those ranks, in one weights group,
    and no group mixes TP indices (a shard summed with another shard would be a wrong gradient, not an error)."""
    want: dict[tuple[int, str], list[int]] = {}
    for r, entry in enumerate(ranks):
        for name in entry["weights"]:
            want.setdefault((entry["tp"]["rank"], name), []).append(r)
    got: dict[tuple[int, str], list[int]] = {}
    for g in groups:
        rs, names = g.get("ranks"), g.get("weights")
        if not (isinstance(rs, list) and all(isinstance(r, int) and 0 <= r < len(ranks) for r in rs)
                and isinstance(names, list) and len({ranks[r]["tp"]["rank"] for r in rs}) == 1):
            raise HetpartError(f"{path}: weights group {g.get('name')} must hold ranks of one TP index (each sums "
                               f"one shard of its weights){EDITED}")
        for name in names:
            got.setdefault((ranks[rs[0]]["tp"]["rank"], name), []).append(rs)
    for (j, name), holders in sorted(want.items()):
        if (len(holders) > 1 or (j, name) in got) and got.get((j, name)) != [holders]:
            raise HetpartError(f"{path}: {name!r} at TP index {j} must be summed over one weights group of the ranks "
                               f"holding it ({holders}){EDITED}")
    extra = sorted(set(got) - set(want))
    if extra:
        raise HetpartError(f"{path}: a weights group sums {extra[0][1]!r}, which no rank of TP index {extra[0][0]} "
                           f"holds{EDITED}")


def _check_slice_weights(path: Path, groups: list[dict[str, Any]], ranks: list[dict[str, Any]],
                         tp: list[dict[str, Any]]) -> None:
    """NOTE [mixed-degree gradient sync] in partitioner/tp_sync.py: the weights groups are exactly the slice groups
    the ranks' own weight lists and their stages' splits give (a slice summed over other ranks, or a copy left out,
    would be a wrong gradient, not an error)."""
    from hetpart.partitioner.tp_sync import held_by, slice_buckets, weight_slices

    held = held_by((e["ranks"], ranks[e["ranks"][0]]["weights"], e["weights"], f"mesh.tensor_parallel[{i}]")
                   for i, e in enumerate(tp))
    try:
        want = {rs: {x.weight: x for x in xs} for rs, xs in slice_buckets(weight_slices(held)).items()}
    except HetpartError as err:
        raise HetpartError(f"{path}: {err}{EDITED}") from None
    got: dict[tuple, dict] = {}
    for g in groups:
        slices = g.get("slices", {})
        if not (isinstance(g.get("ranks"), list) and isinstance(g.get("weights"), list) and isinstance(slices, dict)):
            raise HetpartError(f"{path}: weights group {g.get('name')} needs ranks, weights and slices{EDITED}")
        got[tuple(g["ranks"])] = {w: slices.get(w) for w in g["weights"]}
    for rs in sorted(set(want) | set(got)):
        expect = {w: None if x.split is None else {"index": x.index, "of": x.of, "dim": x.split[0],
                                                   "chunks": x.split[1]} for w, x in want.get(rs, {}).items()}
        if got.get(rs) != expect:
            raise HetpartError(f"{path}: the weights group of ranks {list(rs)} must sum "
                               f"{sorted(expect) or 'nothing'} (their slices: NOTE [mixed-degree gradient sync]), "
                               f"it sums {sorted(got.get(rs, {})) or 'nothing'}{EDITED}")


def lane_group(manifest: dict[str, Any], rank: int) -> str:
    """The pipeline group of `rank`'s TP index (its lane): the peers it sends to and receives from; with mixed
    degrees the leaders' one group (NOTE [mixed-degree pipeline] in runtime/tp_pipeline.py)."""
    entry = manifest["ranks"][rank]
    if "pipelines" in manifest["mesh"]:  # NOTE [tensor-parallel pipelines mesh] in codegen/tp.py
        q = manifest["mesh"]["pipelines"][entry["pipeline"]]
        return q["group"] if is_mixed(manifest) else q["lanes"][entry["tp"]["rank"]]  # NOTE [mixed-degree pipelines
        # mesh]: the pipeline's leaders
    return "pipeline" if is_mixed(manifest) else f"pipeline-tp{entry['tp']['rank']}"


def tp_rank(entry: dict[str, Any]) -> int:
    """This rank's place in its TP group (0 outside tensor parallelism)."""
    return entry.get("tp", {}).get("rank", 0)


def tp_entry(manifest: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any] | None:
    """The mesh's `tensor_parallel` entry of this rank's stage (its ranks, degree, group, split weights); None outside
    tensor parallelism."""
    if not is_tp(manifest):
        return None
    return next(e for e in manifest["mesh"]["tensor_parallel"] if entry["rank"] in e["ranks"])


def weight_shards(manifest: dict[str, Any], entry: dict[str, Any]) -> dict[str, dict[str, int]]:
    """This rank's split weights: FQN -> the split's dim and chunks, and the rank's place (rank, degree) in its TP
    group; {} outside tensor parallelism. What a checkpoint records of its shards (NOTE [checkpoint slices])."""
    stage_tp = tp_entry(manifest, entry)
    if stage_tp is None:
        return {}
    return {name: {"dim": spec["dim"], "chunks": spec["chunks"], "rank": tp_rank(entry), "degree": stage_tp["degree"]}
            for name, spec in stage_tp["weights"].items()}


def attach_group(module: torch.nn.Module, manifest: dict[str, Any], entry: dict[str, Any],
                 groups: dict[str, dist.ProcessGroup]) -> None:
    """Point the stage.py's collectives (`TP_GROUP`) at this stage's TP process group."""
    stage_tp = tp_entry(manifest, entry)
    if stage_tp is not None and stage_tp["group"] is not None:  # None: a stage of degree 1 beside TP stages
        sys.modules[type(module).__module__].TP_GROUP = groups[stage_tp["group"]]


def gather_shards(tensors: dict[str, torch.Tensor], manifest: dict[str, Any], entry: dict[str, Any],
                  groups: dict[str, dist.ProcessGroup], device: torch.device) -> dict[str, torch.Tensor]:
    """`tensors` (weight FQN -> this rank's value or gradient) with each split weight's parts gathered from
    the TP group into the whole tensor, for --verify against the unpartitioned model. Every TP rank of the
    stage calls it with the same names (it runs collectives, on `device`: nccl gathers GPU tensors only)."""
    stage_tp = tp_entry(manifest, entry)
    if stage_tp is None:
        return tensors
    out = dict(tensors)
    for name in sorted(stage_tp["weights"]):
        if name not in tensors:
            continue
        part = tensors[name].to(device).contiguous()
        parts = [torch.empty_like(part) for _ in stage_tp["ranks"]]
        dist.all_gather(parts, part, group=groups[stage_tp["group"]])
        spec = stage_tp["weights"][name]
        out[name] = unshard_tensor(parts, WeightShard(spec["dim"], spec["chunks"])).to(tensors[name].device)
    return out


def whole_weights(loaded: list[dict[str, torch.Tensor]], manifest: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """Each rank's weights.safetensors (`loaded[r]`) with every split weight whole again: its TP group's parts
    put together (NOTE [tensor-parallel stages]); the reference model of --verify loads them."""
    if not is_tp(manifest):
        return loaded
    out = [dict(t) for t in loaded]
    for stage_tp in manifest["mesh"]["tensor_parallel"]:
        for name, spec in stage_tp["weights"].items():
            parts = [loaded[r][name] for r in stage_tp["ranks"] if name in loaded[r]]
            if len(parts) == len(stage_tp["ranks"]):
                for r in stage_tp["ranks"]:
                    out[r][name] = unshard_tensor(parts, WeightShard(spec["dim"], spec["chunks"]))
    return out


def break_for_test(module: torch.nn.Module, manifest: dict[str, Any], entry: dict[str, Any],
                   names: dict[str, str]) -> None:
    """HETPART_TEST_BREAK_TP=shard (tests only, NOTE [test-only crash hook] in worker.py): TP rank 1 doubles its
    split weights' gradients, so that `--verify` must fail on exactly those shards."""
    stage_tp = tp_entry(manifest, entry)
    if os.environ.get("HETPART_TEST_BREAK_TP") != "shard" or stage_tp is None or tp_rank(entry) != 1:
        return
    for attr, p in module.named_parameters():
        if names.get(attr) in stage_tp["weights"] and p.grad is not None:
            p.grad.mul_(2)


__all__ = ["attach_group", "break_for_test", "check_tp_mesh", "gather_shards", "is_mixed", "is_tp", "lane_group",
           "tp_degrees", "tp_entry", "tp_rank", "weight_shards", "whole_weights"]
