"""The artifacts directory: per-rank stage source and weights, plan.json, manifest.json.

    out/
      plan.json                 stages, devices, predicted times, bound, gap, model spec
      manifest.json             per rank: files + sha256, inputs/outputs, device, backend
      rank<k>/stage.py          standalone nn.Module source (torch + safetensors only)
      rank<k>/weights.safetensors
      rank<k>/weights.json      (plans traced on meta) what shard-weights fills, and
      rank<k>/constants.safetensors   the buffers and constants that have values already
      ir/                       numbered pass dumps and graph.json
      timings.json              run-specific numbers: seconds per step (hetpart/timings.py)

Everything but timings.json is deterministic for the same inputs. The directory
is built beside the target and renamed into place, so an interrupted run leaves
no partial directory (hetpart/codegen/publish.py).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hetpart.codegen.pt2 import write_pt2
from hetpart.codegen.source import stage_source
from hetpart.codegen.split import StageGraph, shared_weights_file
from hetpart.codegen.weights import write_weight_manifest, write_weights
from hetpart.fsio import atomic_write
from hetpart.ir import info
from hetpart.timings import StepTimes
from hetpart.trust import MANIFEST_FORMAT_VERSION, sha256_file, write_signature

if TYPE_CHECKING:
    from hetpart.devices import Cluster

FORMAT_VERSION = MANIFEST_FORMAT_VERSION
sha256 = sha256_file


def write_json(path: Path, data: Any) -> None:
    atomic_write(path, json.dumps(data, indent=2, sort_keys=False) + "\n")  # NOTE [safe writes]


def _boundary(stage: StageGraph) -> tuple[list[dict], list[dict]]:
    """Name, symbolic shape and dtype of each input and output of a stage, in order."""
    graph = stage.gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    returned = graph.find_nodes(op="output")[0].args[0]

    def describe(node, name: str) -> dict:
        return {"name": name, "shape": list(info(node).shape or ()), "dtype": info(node).dtype}

    return ([describe(n, name) for n, name in zip(placeholders, stage.inputs)],
            [describe(n, name) for n, name in zip(returned, stage.outputs)])


def write_rank(rank_dir: Path, stage: StageGraph, header: str,
               example: tuple[torch.Tensor, ...] | None = None,
               checkpoint_names: dict[str, list[str]] | None = None,
               times: StepTimes | None = None) -> dict[str, str]:
    """stage.py, weights.safetensors and (given example inputs) stage.pt2 for one rank; {file: sha256}.

    With `checkpoint_names` (a plan traced on meta), weights.json and constants.safetensors
    stand in for weights.safetensors until `hetpart shard-weights` (NOTE [weight manifests]).
    `times` gets one `write/rank<k>/<file>` step per file (its hash included).
    """
    times = times or StepTimes()
    rank_dir.mkdir(parents=True)
    step = lambda name: times.step(f"write/{rank_dir.name}/{name}")  # noqa: E731
    digests: dict[str, str] = {}
    with step("stage.py"):
        params = {name for name, _ in stage.gm.named_parameters()}
        (rank_dir / "stage.py").write_text(stage_source(stage, header, params))
        digests["stage.py"] = sha256(rank_dir / "stage.py")
    tensors: dict[str, torch.Tensor] = {}
    for attr, fqn in stage.weights.items():
        if fqn not in stage.stored_in:  # stored by an earlier rank: NOTE [weights stored once]
            tensors[fqn] = getattr(stage.gm, attr).detach().contiguous()
    if checkpoint_names is not None:
        with step("weights.json"):
            shared = {fqn: shared_weights_file(k) for fqn, k in stage.stored_in.items()}  # NOTE [weights stored once]
            digests.update((f, sha256(rank_dir / f))
                           for f in write_weight_manifest(rank_dir, tensors, checkpoint_names, shared, stage.shards))
    else:
        with step("weights.safetensors"):
            digests["weights.safetensors"] = write_weights(rank_dir / "weights.safetensors", tensors)
    if example is not None:
        with step("stage.pt2"):
            write_pt2(rank_dir / "stage.pt2", stage, example)
            digests["stage.pt2"] = sha256(rank_dir / "stage.pt2")
    return digests


@dataclass(frozen=True)
class PlannedDevice:
    name: str  # "<machine>/<index>"
    type: str  # device type name; "cpu" runs on the host
    machine: str

    @staticmethod
    def of_ranks(cluster: Cluster, names: list[str]) -> list[PlannedDevice]:
        """Each rank's device, named in `names` (one per rank), as the manifest records it."""
        by_name = {d.name: d for d in cluster.devices}  # once: Cluster.devices builds a new list per read
        return [PlannedDevice(by_name[n].name, by_name[n].type.name, by_name[n].machine) for n in names]


def launch_groups(devices: list[PlannedDevice]) -> list[list[int]]:
    """Ranks grouped into torchrun "nodes": maximal runs of consecutive stages on one machine.

    NOTE [ranks are stages]: torchrun's static rendezvous numbers ranks node by
    node (node_rank order, then local rank), so starting one torchrun per group
    in group order makes global rank k run stage k, whatever the machines' order.
    A machine that hosts two separate runs of stages starts two torchruns.
    """
    groups: list[list[int]] = []
    for k, dev in enumerate(devices):
        if groups and devices[groups[-1][-1]].machine == dev.machine:
            groups[-1].append(k)
        else:
            groups.append([k])
    return groups


def _runtime_device(dev: PlannedDevice) -> str:
    return "cpu" if dev.type == "cpu" else f"cuda:{dev.name.rpartition('/')[2]}"


# NOTE [the mesh]: stage and rank are different things (a stage may later run on a
# data-parallel replica set or a tensor-parallel group), so manifest.json says which ranks
# run each stage and which process groups each rank joins, as torch.distributed.pipelining
# takes them (`PipelineStage(group=...)`, `stage_index_to_group_rank`):
#   "mesh": {"stages": [[0], [1], ...],            stage -> its ranks (today one: rank k runs stage k)
#            "groups": [{"name": "pipeline", "kind": "pipeline", "ranks": [0, 1, ...]},
#                       {"name": "weights-0", "kind": "weights", "ranks": [0, 3], "weights": ["wte.weight"]}],
#            "rank_groups": [["pipeline", "weights-0"], ["pipeline"], ...]}   the groups of each rank
# The pipeline group holds one rank per stage, in stage order: a stage's send and receive
# peers are its neighbours' ranks in it. A `weights` group is the ranks that hold copies of
# the same weights (a tied embedding and LM head, NOTE [replicated weights] in
# runtime/worker.py): training sums those copies' gradients over it. Each rank creates every
# group with `torch.distributed.new_group`, in this order (torch requires the same order on
# all ranks); `load_manifest` checks the mesh against the ranks before any rank starts.
# Several data-parallel pipelines (issue 19) number their ranks pipeline-major (pipeline 0's
# stages, then pipeline 1's, ...); the mesh then has no top-level "stages" but one entry per
# pipeline, and one "pipeline" group each:
#   "pipelines": [{"index": 0, "group": "pipeline-0", "stages": [[0], [1]], "microbatches": 2,
#                  "microbatch_offset": 0}, {"index": 1, "group": "pipeline-1", "stages": [[2], [3], [4]], ...}]
# and each rank entry says its "pipeline", that pipeline's "microbatches" and its "batch_rows"
# [start, stop) of the traced batch (at another --batch-size, the same microbatches of it).
# A "weights" group is then every rank holding a copy of the weight, across pipelines and within
# one: training sums the scaled gradients over it (NOTE [pipelines gradients] in runtime/worker.py).
# Pipelines of tensor-parallel stages: NOTE [tensor-parallel pipelines mesh] in codegen/tp.py.
def mesh(rank_weights: list[list[str]], shares: list[int] | None = None, stage_counts: list[int] | None = None) -> dict:
    """The mesh of a plan whose rank k holds the weights `rank_weights[k]` (NOTE [the mesh]): one pipeline
    (rank k runs stage k), or with `shares` and `stage_counts` several, each with that many microbatches and
    stages, ranks numbered pipeline-major."""
    world = len(rank_weights)
    holders: dict[str, list[int]] = {}
    for rank, names in enumerate(rank_weights):
        for name in names:
            holders.setdefault(name, []).append(rank)
    shared: dict[tuple[int, ...], list[str]] = {}
    for name, ranks in sorted(holders.items()):
        if len(ranks) > 1:
            shared.setdefault(tuple(ranks), []).append(name)
    weight_groups = [{"name": f"weights-{i}", "kind": "weights", "ranks": list(ranks), "weights": names}
                     for i, (ranks, names) in enumerate(sorted(shared.items()))]
    if shares is None or stage_counts is None:
        groups: list[dict[str, Any]] = [{"name": "pipeline", "kind": "pipeline", "ranks": list(range(world))}]
        groups += weight_groups
        return {"stages": [[k] for k in range(world)], "groups": groups,
                "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(world)]}
    pipelines, first_rank, offset = [], 0, 0
    for p, (m, count) in enumerate(zip(shares, stage_counts)):
        ranks = list(range(first_rank, first_rank + count))
        pipelines.append({"index": p, "group": f"pipeline-{p}", "stages": [[r] for r in ranks], "microbatches": m,
                          "microbatch_offset": offset})
        first_rank, offset = first_rank + count, offset + m
    groups = [{"name": q["group"], "kind": "pipeline", "ranks": [r for s in q["stages"] for r in s]}
              for q in pipelines] + weight_groups
    return {"pipelines": pipelines, "groups": groups,
            "rank_groups": [[g["name"] for g in groups if r in g["ranks"]] for r in range(world)]}


def manifest(stages: list[StageGraph], files: list[dict[str, str]], devices: list[PlannedDevice],
             shares: list[int] | None = None, microbatch_size: int = 0) -> dict:
    """manifest.json of `stages` in rank order (NOTE [the mesh]). With `shares` (several pipelines: each one's
    microbatches of `microbatch_size` rows), a pipeline starts at each stage 0."""
    groups = launch_groups(devices)
    node_of = {k: (n, i) for n, ranks in enumerate(groups) for i, k in enumerate(ranks)}
    all_gpu = all(d.type != "cpu" for d in devices)
    if shares is not None:
        starts = [k for k, s in enumerate(stages) if s.index == 0] + [len(stages)]
        counts = [b - a for a, b in zip(starts, starts[1:])]
        man = manifest(stages, files, devices)
        man["mesh"] = mesh([sorted(s.weights.values()) for s in stages], list(shares), counts)
        return place_pipelines(man, microbatch_size)
    return {
        "format_version": FORMAT_VERSION,
        "files": {},  # plan.json, launch.sh, ir/: filled by write_manifest
        "world_size": len(stages),
        "backend": "nccl" if all_gpu else "gloo",
        "nodes": [{"node_rank": n, "machine": devices[ranks[0]].machine, "ranks": ranks}
                  for n, ranks in enumerate(groups)],
        "ranks": [
            {
                "rank": k,
                "stage": s.index,
                "device": _runtime_device(devices[k]) if all_gpu else "cpu",
                "planned_device": devices[k].name,
                "machine": devices[k].machine,
                "node_rank": node_of[k][0],
                "local_rank": node_of[k][1],
                "dir": f"rank{k}",
                "files": files[k],
                "inputs": _boundary(s)[0],
                "outputs": _boundary(s)[1],
                "weights": sorted(s.weights.values()),
            }
            for k, s in enumerate(stages)
        ],
        "mesh": mesh([sorted(s.weights.values()) for s in stages]),
    }


def place_pipelines(man: dict, microbatch_size: int) -> dict:
    """Each rank's pipeline, that pipeline's microbatches and its `batch_rows` of the traced batch, from the
    mesh's `pipelines` (NOTE [the mesh])."""
    for q in man["mesh"]["pipelines"]:
        start = q["microbatch_offset"] * microbatch_size
        rows = [start, start + q["microbatches"] * microbatch_size]
        for r in (r for stage in q["stages"] for r in stage):
            man["ranks"][r].update(pipeline=q["index"], microbatches=q["microbatches"], batch_rows=rows)
    return man


def write_manifest(out: Path, man: dict, sign_key: bytes | None = None) -> None:
    """manifest.json, last: it hashes plan.json, launch.sh and ir/ (written before it) besides the rank
    files, and is the root of trust (NOTE [artifacts are code] in hetpart/trust.py); with `sign_key`,
    manifest.json.hmac too."""
    listed = ["plan.json", "launch.sh", *sorted(p.relative_to(out).as_posix() for p in (out / "ir").rglob("*")
                                                if p.is_file())]
    man["files"] = {name: sha256(out / name) for name in listed if (out / name).is_file()}
    write_json(out / "manifest.json", man)
    if sign_key is not None:
        write_signature(out, sign_key)


def launch_script(man: dict) -> str:
    """launch.sh: one torchrun command line per node (see NOTE [ranks are stages]).

    Every value from the manifest is shell-quoted (a machine name is any string of the cluster
    file), and none goes into a comment, where a newline would end it.
    """
    q = lambda value: shlex.quote(str(value))  # noqa: E731
    nnodes = len(man["nodes"])
    cases = []
    for node in man["nodes"]:
        ranks = node["ranks"]
        cases.append(
            f"  {q(node['node_rank'])})\n"
            f"    MACHINE={q(node['machine'])} STAGES={q(', '.join(map(str, ranks)))}\n"
            f"    exec torchrun --nnodes {q(nnodes)} --node-rank {q(node['node_rank'])} "
            f"--nproc-per-node {q(len(ranks))} \\\n"
            f"      --rdzv-backend static --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\\n"
            f"      -m hetpart.runtime.worker \"$DIR\" \"$@\" ;;"
        )
    body = "\n".join(cases)
    return f"""#!/usr/bin/env bash
# torchrun command lines for this plan, one per node: MACHINE and STAGES name the machine and the stages it runs.
# On each machine, with this directory copied there:
#   MASTER_ADDR=<host of node 0> MASTER_PORT=29500 ./launch.sh NODE_RANK --io IO_DIR --microbatches M [worker options]
# NODE_RANK 0 must be able to read IO_DIR/inputs.safetensors; the last node writes IO_DIR/outputs.safetensors.
set -euo pipefail
WORLD_SIZE={q(man['world_size'])} NNODES={q(nnodes)} BACKEND={q(man['backend'])}
DIR="$(cd "$(dirname "${{BASH_SOURCE[0]}}")" && pwd)"
MASTER_ADDR="${{MASTER_ADDR:-127.0.0.1}}"
MASTER_PORT="${{MASTER_PORT:-29500}}"
NODE_RANK="${{1:?usage: launch.sh NODE_RANK [worker options]}}"
shift
case "$NODE_RANK" in
{body}
  *) echo "launch.sh: NODE_RANK must be 0..$((NNODES - 1)) ($WORLD_SIZE rank(s), backend $BACKEND)" >&2; exit 2 ;;
esac
"""
