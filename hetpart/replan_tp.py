"""`hetpart replan` of a tensor-parallel plan: the same degree on the new cluster's TP groups (NOTE [re-plan of
tensor-parallel plans]).

NOTE [re-plan of tensor-parallel plans]
A plan whose every stage is a TP group of degree t (NOTE [tensor-parallel stages] in codegen/tp.py) is
re-planned at the same degree t:
- The groups: `tp_groups` of the new cluster (each machine's devices of one type in groups of t, in
  cluster order), with each machine's devices put in an order that keeps what survives (`keep_groups`):
  first every old group whose devices all survive, whole and in its old TP order (nothing moves for its
  stages if they stay there); then the other devices of each type grouped so that a survivor sits at its
  old TP index where one can (it holds that index's shards); what is left over (fewer than t) stays
  unused. The new cluster written to NEW_DIR's plan.json is in that order, so `partition`'s lowering of
  it at write time makes the same groups. A choice of groups, not a search over them: the re-plan's
  claims hold over the plans of these groups.
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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from hetpart.devices import Cluster
from hetpart.devices.cluster import ClusterDevice, Machine
from hetpart.errors import HetpartError
from hetpart.partitioner import Problem
from hetpart.partitioner.problem import Device
from hetpart.partitioner.replan_holdings import Holdings, OldRank, tp_holdings


def old_tp_groups(manifest: dict) -> list[tuple[str, ...]]:
    """Each stage's TP group of an old TP plan: its ranks' planned devices in TP order."""
    from hetpart.runtime.artifacts import mesh_pipelines

    ranks = manifest["ranks"]
    return [tuple(ranks[r]["planned_device"] for r in stage) for stage in mesh_pipelines(manifest)[0].stages]


def plan_degree(old: Path, manifest: dict, stored: Problem) -> int:
    """The degree of every stage of an old TP plan; an error where the stages' degrees differ or the stored
    problem was not lowered at it (NOTE [re-plan of tensor-parallel plans])."""
    from hetpart.passes.tp_lower import tp_type

    degrees = sorted({len(g) for g in old_tp_groups(manifest)})
    if len(degrees) != 1:
        raise HetpartError(f"{old} mixes tensor-parallel degrees {degrees} but has no record of them (partitioned by "
                           "an earlier hetpart): partition again to re-plan it (NOTE [re-plan of mixed degrees])")
    t = degrees[0]
    if not all(d.type.split("@")[0].endswith(tp_type("", t)) for d in stored.devices):
        raise HetpartError(f"{old}'s stored analysis is not of its TP-{t} groups (partitioned by an earlier hetpart); "
                           f"partition again with --tensor-parallel {t} to re-plan")
    return t


def keep_groups(target: Cluster, old_groups: list[tuple[str, ...]], degree: int | Mapping[str, int]) -> Cluster:
    """`target` with each machine's devices ordered so that `tp_groups` keeps the old groups that survive and
    puts survivors at their old TP index (NOTE [re-plan of tensor-parallel plans]); `degree` one for all, or each
    place's (`machine:type`, NOTE [re-plan of mixed degrees] in replan_mixed.py): an old group is kept whole where
    its place keeps its size."""
    index = {d: j for g in old_groups for j, d in enumerate(g)}
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
            degree_here = deg(ty)
            pool = list(devices)
            groups = [[None] * degree_here for _ in range(len(pool) // degree_here)]
            for j in range(degree_here):  # a survivor at its old TP index where one can
                at_j = [d for d in pool if index.get(d.name) == j]
                for g in groups:
                    if at_j:
                        g[j] = at_j.pop(0)
                        pool.remove(g[j])
            for g in groups:
                for j in range(degree_here):
                    if g[j] is None:
                        g[j] = pool.pop(0)
            order += [d for g in groups for d in g]
            rest += pool
        machines.append(Machine(m.name, tuple(order + rest), m.link))
    return Cluster(target.name, tuple(machines), target.network)


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


__all__ = ["holdings_of", "hostable_degrees", "keep_groups", "old_tp_groups", "plan_degree", "retarget_tp"]
