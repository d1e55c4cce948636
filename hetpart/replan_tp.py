"""`hetpart replan` of a tensor-parallel plan: the same degree on the new cluster's TP groups (NOTE [re-plan of
tensor-parallel plans]).

NOTE [re-plan of tensor-parallel plans]
A plan whose every stage is a TP group of degree t (NOTE [tensor-parallel stages] in codegen/tp.py) is
re-planned at the same degree t:
- The groups: `tp_groups` of the new cluster (each machine's devices of one type in groups of t, in
  cluster order), with each machine's devices put in an order that keeps what survives (`keep_groups`):
  first every old group whose devices all survive, whole and in its old TP order (nothing moves for its
  stages if they stay there); then the other devices of each type grouped (`_regroup`): the survivors
  of one old group together (they hold its stage's weights), each at an index whose new shard its old
  shard holds cells of (`holds_shard`: its old index at the same degree; index j of TP T at j // (T/t)
  on a fall to TP t, as TP-T shards nest in TP-t ones), in as many places as any assignment fills;
  what is left over (fewer than t) stays unused. Every group of a place costs the same (one type key,
  one link; one capacity where its devices have equal memory), so the plans of any grouping are the
  same up to names; the bytes differ only by what a new rank holds itself (where it reads the rest
  from is the same for every device of its machine), so this grouping moves the fewest bytes of any
  where each place's survivors come from one old group (tests/partitioner/test_replan_mixed.py checks
  it against every grouping). The new cluster written to NEW_DIR's plan.json is in that order, so
  `partition`'s lowering of it at write time makes the same groups. A choice of groups, not a search
  over them: the re-plan's claims hold over the plans of these groups.
- The costs: the stored problem (ir/analysis.json) is the TP-t problem the old plan was solved on; a new
  group's type key is the stored one of a group of the same device type on a machine with the same link
  (passes/tp_lower.py costs a TP slot from exactly those two: the shard roofline of its type and the
  collectives over its machine's link), its capacity the least of its devices'. A type or link the old
  plan did not cost at degree t is an error naming it.
- The bytes: by shard, NOTE [re-plan by shard] (`tp_holdings`, from the old manifest's mesh through
  runtime/tp.py's helpers: each old rank's TP index and split weights).
- The rest is the one-pipeline re-plan: the from-scratch plan of the TP-t problem, then NOTE
  [lexicographic re-plan] over the same problem (CP-SAT on small problems, NOTE [large re-plan]'s
  candidates on large ones), old devices the old groups in stage order.
A plan of degrees mixed per machine is re-planned at each machine's: NOTE [re-plan of mixed degrees]
(replan_mixed.py), which shares `keep_groups` and adds the fall to a lower degree that costs allow.
Degree t cannot run where no machine has t devices of one type left: the re-plan says so and names the
degrees the new cluster can host, for a `partition` from scratch. It does not fall back by itself: a
degree other than t has no costs in the stored problem (it needs the model traced and lowered again
at that degree) and its shards cut each weight differently (NOTE [checkpoint slices] would read them,
but NOTE [re-plan by shard] counts one degree's shards only). A plan of another degree than the one
its stored problem was lowered at is refused the same way. Virtual-stage plans (interleaved schedules)
are refused by `replan`: their problem is the virtual-stage problem of NOTE [virtual stages plan]
(v stages per device, each device's stages tied), which none of the re-plan's engines models, and whose
bytes would count per device, not per stage.

NOTE [re-plan of tensor-parallel pipelines]
Data-parallel pipelines whose stages are TP groups of degree t (NOTE [tensor-parallel pipelines] in
partitioner/tp_pipelines.py) were planned on the TP-t slot problem, and ir/analysis.json and
ir/pipelines.json store that problem and each pipeline's slots. Their re-plan is NOTE [re-plan pipelines]
run over slots instead of devices, every other step the one above (`tp_slots`):
- the slots: the new cluster's TP-t groups in `keep_groups`' order, built from every old pipeline's
  groups (`old_tp_groups` reads them all); an old group keeps its name (its devices joined by "+")
  exactly when all its devices survive, so an old pipeline is kept when all its slots are; a lost
  device takes its whole group with it (its partners fall out of it, into a new group where a place has
  t devices left, else unused: "in no tensor-parallel group" in plan.json);
- the costs: `retarget_tp` (each new slot the stored key of a slot of its type and link);
- the bytes: by shard (NOTE [re-plan by shard], `holdings_of` from every old rank of the mesh, NOTE
  [tensor-parallel pipelines mesh]): a kept stage moves nothing, a repaired or new one reads each TP
  index's shard from a surviving holder of that index (in any pipeline), else the checkpoint;
- the candidates and the choice are NOTE [re-plan pipelines]'s (kept pipelines re-split, broken ones
  dropped or repaired on their surviving slots, a new pipeline on free slots, the from-scratch
  `--parallel data` plan of the slot problem), none claimed optimal: the bound printed is the
  from-scratch plan's, a bound on every plan of these slots at degree t (not of other groupings or
  degrees of the new cluster, which the re-plan does not consider);
- NEW_DIR is written by `partition`'s own path for `--parallel data --tensor-parallel t`
  (compile_pipelines with `PipelinesChoice` in place of its search), on the new cluster in `keep_groups`'
  order so that its lowering makes the same slots: the mesh of NOTE [tensor-parallel pipelines mesh]
  (one pipeline: NOTE [tensor-parallel stages]'s), which `run --resume` fills from the old ranks'
  shards (NOTE [checkpoint slices]).
A new cluster with no t devices of one type on any machine is refused as above (exit 2).
Pipelines planned over slots of several degrees (`--pipelines` or `--parallel data` with `--tensor-parallel
MACHINE=T,...`, NOTE [mixed-degree pipelines mesh] in codegen/tp.py) are refused by `replan` (exit 2, before
anything is written): their stored problem holds slots of each degree but no `tensor_parallel` record of the
places' degrees and split weights (NOTE [re-plan of mixed degrees] needs one), `tp_slots` and `holdings_of`
are one degree's, and `compile_pipelines` writes a `PipelinesChoice` at one degree. The advice is a
`partition` for the new cluster, then `run --resume`, which reads their checkpoint's slices into any plan
(tests/runtime/test_dp_tp_mixed_run.py runs it: --verify equal to 4 steps of the model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hetpart.devices import Cluster
from hetpart.devices.cluster import ClusterDevice, Machine
from hetpart.errors import HetpartError
from hetpart.partitioner import Problem
from hetpart.partitioner.problem import Device
from hetpart.partitioner.replan_holdings import Holdings, OldRank, cells, tp_holdings


def old_tp_groups(manifest: dict) -> list[tuple[str, ...]]:
    """Each stage's TP group of an old TP plan: its ranks' planned devices in TP order; every pipeline's stages, in
    rank order, for data-parallel pipelines of TP stages (NOTE [re-plan of tensor-parallel pipelines])."""
    from hetpart.runtime.artifacts import mesh_pipelines

    ranks = manifest["ranks"]
    return [tuple(ranks[r]["planned_device"] for r in stage) for q in mesh_pipelines(manifest) for stage in q.stages]


def plan_degree(old: Path, manifest: dict, stored: Problem) -> int:
    """The degree of every stage of an old TP plan; an error where the stages' degrees differ or the stored
    problem was not lowered at it (NOTE [re-plan of tensor-parallel plans])."""
    from hetpart.passes.tp_lower import tp_type
    from hetpart.runtime.tp import tp_degrees

    degrees = tp_degrees(manifest)
    if len(degrees) > 1:  # (`runtime.tp.is_mixed`, the degrees at hand)
        raise HetpartError(f"{old} mixes tensor-parallel degrees {degrees} but has no record of them (partitioned by "
                           "an earlier hetpart): partition again to re-plan it (NOTE [re-plan of mixed degrees])")
    t = degrees[0]
    if not all(d.type.split("@")[0].endswith(tp_type("", t)) for d in stored.devices):
        raise HetpartError(f"{old}'s stored analysis is not of its TP-{t} groups (partitioned by an earlier hetpart); "
                           f"partition again with --tensor-parallel {t} to re-plan")
    return t


def keep_groups(target: Cluster, old_groups: list[tuple[str, ...]], degree: int | Mapping[str, int]) -> Cluster:
    """`target` with each machine's devices ordered so that `tp_groups` keeps the old groups that survive and
    puts survivors where they hold their new shard (NOTE [re-plan of tensor-parallel plans]); `degree` one for all,
    or each place's (`machine:type`, NOTE [re-plan of mixed degrees] in replan_mixed.py): an old group is kept whole
    where its place keeps its size."""
    old = {d: (g, j) for g in old_groups for j, d in enumerate(g)}
    machines = []
    for m in target.machines:
        names = {d.name for d in m.devices}
        by_name = {d.name: d for d in m.devices}
        deg = (lambda ty: degree) if isinstance(degree, int) else (lambda ty: degree[f"{m.name}:{ty}"])  # noqa: E731
        kept = [d for g in old_groups if set(g) <= names and len(g) == deg(by_name[g[0]].type.name) for d in g]
        order = [by_name[d] for d in kept]
        by_type: dict[str, list[ClusterDevice]] = {}
        for d in m.devices:
            if d.name not in kept:
                by_type.setdefault(d.type.name, []).append(d)
        rest = []
        for ty, devices in by_type.items():
            groups, unused = _regroup(devices, deg(ty), old)
            order += [d for g in groups for d in g]
            rest += unused
        machines.append(Machine(m.name, tuple(order + rest), m.link))
    return Cluster(target.name, tuple(machines), target.network, target.memory_reserve_bytes)


def holds_shard(j: int, old_degree: int, i: int, degree: int) -> bool:
    """Whether shard j of a weight split at TP `old_degree` holds cells of its shard i at TP `degree`: shards of
    powers of two nest (TP-4's shard j lies in TP-2's j // 2; TP-1's whole holds every shard), as
    `replan_holdings.cells` cuts them."""
    finest = max(old_degree, degree)
    return not set(cells(old_degree, j, finest)).isdisjoint(cells(degree, i, finest))


def _regroup(devices: list[ClusterDevice], degree: int, old: Mapping[str, tuple[tuple[str, ...], int]]
             ) -> tuple[list[list[ClusterDevice]], list[ClusterDevice]]:
    """One place's devices (those of no old group kept whole) in groups of `degree`, and the unused rest: the
    survivors of one old group together first (the old group with the most first; they hold its stage's
    weights), each at an index whose new shard its old one holds cells of (`holds_shard`), as many of them
    as can be; then the rest the same way, fresh devices last (NOTE [re-plan of tensor-parallel plans])."""
    n = len(devices) // degree
    survivors: dict[tuple[str, ...], list[ClusterDevice]] = {}
    for d in devices:
        if d.name in old:
            survivors.setdefault(old[d.name][0], []).append(d)
    groups: list[list[ClusterDevice]] = []
    for members in sorted(survivors.values(), key=lambda ms: -len(ms)):
        k = min(len(members) // degree, n - len(groups))
        if k > 0:
            groups += _fill(members, k, degree, old)
    placed = {d.name for g in groups for d in g}
    left = [d for ms in sorted(survivors.values(), key=lambda ms: -len(ms)) for d in ms if d.name not in placed]
    left += [d for d in devices if d.name not in old]
    groups += _fill(left, n - len(groups), degree, old)
    return groups, left


def _fill(pool: list[ClusterDevice], k: int, degree: int, old: Mapping[str, tuple[tuple[str, ...], int]]
          ) -> list[list[ClusterDevice]]:
    """`k` groups of `degree` from `pool` (taken from it): first every index of every group a device holding
    cells of that index's shard (the most such places any assignment fills: each holder fits one index), then
    the empty places from the rest in `pool`'s order."""
    groups: list[list[ClusterDevice | None]] = [[None] * degree for _ in range(k)]
    for i in range(degree):
        for g in groups:
            d = next((d for d in pool if d.name in old and holds_shard(old[d.name][1], len(old[d.name][0]), i,
                                                                       degree)), None)
            if d is not None:
                g[i] = d
                pool.remove(d)
    for g in groups:
        for i in range(degree):
            if g[i] is None:
                g[i] = pool.pop(0)
    return groups  # type: ignore[return-value]


def hostable_degrees(cluster: Cluster) -> list[int]:
    """The TP degrees (hetpart's, up to a machine's count of one type) some machine of `cluster` can host."""
    from hetpart.tensor_parallel import TP_DEGREES

    return [t for t in TP_DEGREES if t <= _most_of_one_type(cluster)]


def _most_of_one_type(cluster: Cluster) -> int:
    """The most devices of one type any machine of `cluster` has: the largest TP group it can host."""
    return max(sum(1 for d in m.devices if d.type.name == t.type.name) for m in cluster.machines for t in m.devices)


def retarget_tp(stored: Problem, old_cluster: Cluster, target: Cluster, degree: int, old: Path) -> Problem:
    """The stored TP-`degree` problem on `target`'s TP groups (NOTE [re-plan of tensor-parallel plans])."""
    from hetpart.passes.lower import cluster_fields
    from hetpart.passes.tp_lower import tp_groups

    old_link, link = {m.name: m.link for m in old_cluster.machines}, {m.name: m.link for m in target.machines}
    costed = {d.name: d.type for d in stored.devices}
    key_of = {(g.type, old_link[g.machine]): costed[g.name] for g in tp_groups(old_cluster, degree)
              if g.name in costed}
    if _most_of_one_type(target) < degree:
        can = ", ".join(map(str, hostable_degrees(target)))
        raise HetpartError(f"{old} runs tensor-parallel stages of degree {degree}, and no machine of the new cluster "
                           f"has {degree} devices of one type left (`hetpart replan` keeps the degree): partition "
                           f"from scratch for it with --tensor-parallel T, T one of the degrees it can host: {can} "
                           "(1: leave the flag out); `run --resume` reads the checkpoint's shards into any degree")
    devices = []
    by_name = {d.name: d for d in target.devices}
    for g in tp_groups(target, degree):
        key = key_of.get((g.type, link[g.machine]))
        if key is None:
            raise HetpartError(f"the new cluster's TP-{degree} group {g.name} ({g.type} on machine {g.machine}, its "
                               f"link {link[g.machine]}) was not costed when the old plan was made (no group of that "
                               "type on a machine with that link): partition from scratch with `hetpart partition "
                               f"... --tensor-parallel {degree} --cluster NEW`")
        devices.append(Device(g.name, key, g.machine, min(by_name[d].mem_bytes for d in g.devices)))
    fields = cluster_fields(target, stored.training is not None)
    return dataclasses.replace(stored, devices=devices, intra_node_links=fields["intra_node_links"],
                               network=fields["network"])


def holdings_of(manifest: dict, problem: Problem, target: Cluster, degree: int) -> Holdings:
    """NOTE [re-plan by shard]'s parts of an old TP plan's state on `problem`'s groups of `target`."""
    from hetpart.passes.tp_lower import tp_groups
    from hetpart.runtime.tp import tp_rank, weight_shards

    old = [OldRank(e["planned_device"], tp_rank(e), tuple(e["weights"])) for e in manifest["ranks"]]
    split = {w for e in manifest["ranks"] for w in weight_shards(manifest, e)}
    groups = {g.name: g.devices for g in tp_groups(target, degree)}
    return tp_holdings(problem, degree, groups, {d.name: d.machine for d in target.devices}, old, split)


@dataclass(frozen=True)
class TPSlots:
    """An old TP plan's re-plan problem (NOTE [re-plan of tensor-parallel plans]): its degree, the new cluster in
    `keep_groups`' order, the stored problem on its TP groups, and where each shard lies."""

    degree: int
    target: Cluster
    problem: Problem
    holdings: Holdings
    old_groups: list[tuple[str, ...]]  # every old stage's group, in rank order


def tp_slots(old: Path, manifest: dict, stored: Problem, old_cluster: Cluster, target: Cluster) -> TPSlots:
    """The TP-t slots of `target` an old TP plan (one pipeline, or several: NOTE [re-plan of tensor-parallel
    pipelines]) is re-planned over, at its degree t."""
    degree = plan_degree(old, manifest, stored)
    groups = old_tp_groups(manifest)
    target = keep_groups(target, groups, degree)
    problem = retarget_tp(stored, old_cluster, target, degree, old)
    return TPSlots(degree, target, problem, holdings_of(manifest, problem, target, degree), groups)


__all__ = ["TPSlots", "tp_slots", "holdings_of", "holds_shard", "hostable_degrees", "keep_groups", "old_tp_groups", "plan_degree",
           "retarget_tp"]
