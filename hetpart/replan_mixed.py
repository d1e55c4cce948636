"""`hetpart replan` of a plan whose tensor-parallel degree differs per machine (NOTE [re-plan of mixed degrees]).

NOTE [re-plan of mixed degrees]
A plan of mixed degrees (`--tensor-parallel MACHINE=T,...` or `--max-tensor-parallel N
--tensor-parallel-per-machine`, NOTE [mixed tensor-parallel degrees] in partitioner/tp_choice.py) stores
the problem it was solved on: its slots (TP groups of their degree's type key `<type>/tp<t>`, single
devices of their type), each node's time and memory per slot type, each type's held bytes
(`held_bytes_of`), and in ir/analysis.json a `tensor_parallel` record: each place's degree (a machine's
devices of one type, `TPSlot.place`), the weights each degree's sharding splits, and each weight's
whole state that moves (`TPCompile.analysis_record`). The re-plan retargets that problem, no trace:
- The degrees: each place of the new cluster keeps its old degree t where its surviving devices
  number t or more; otherwise (a device of its group lost), and on a place the old plan did not have,
  the largest degree the stored problem costed for that device type (and, above 1, that machine link:
  passes/tp_lower.py costs a group from exactly those two) that its devices can host: a machine whose
  link changed falls so too, and the note says it is the link. A place with no such degree is an
  error naming what was costed, and a device type never costed one saying so. A choice, not a search
  over degrees.
- The groups: NOTE [re-plan of tensor-parallel plans]'s `keep_groups` per place at its degree: old
  groups that survive whole at a place of their size first, in their TP order, then the other devices
  with each old group's survivors together at indices whose shard theirs nests in (TP-4's index j at
  TP 2's j // 2); a remainder below t stays unused. NEW_DIR is compiled with
  those degrees (`CompileOptions.tensor_parallel_places`) on the cluster in that order, so its
  lowering makes the same slots under the same names.
- The slots' type keys, capacities: a new group's key is the stored one of the same type, degree
  and link (`@machine` where links differed), its capacity the least of its devices'.
- The bytes: NOTE [re-plan by shard] with `mixed_holdings`: a weight is cut in cells, 1/f of it for f the
  largest degree that splits it (shards of powers of two nest: TP-4's shard j lies in TP-2's j // 2);
  an old rank holds the cells of its shard, or all of them; a new TP-t rank needs its shard's cells
  at t where t's sharding splits the weight, all of them otherwise (`Holdings.needed(w, slot)`); a
  whole assembled from two old halves reads one from each, as the resume does (NOTE [checkpoint
  slices]).
- The rest is the one-pipeline re-plan (from scratch, then NOTE [lexicographic re-plan]), old
  devices the old stages' groups in stage order.
A plan of degrees per machine whose every stage ended on one device is written without tensor
parallelism (a plain manifest, no TP group in its mesh), yet its ir/analysis.json is that mixed problem
with its `tensor_parallel` record: it is re-planned here too (not as a plain plan, whose fresh trace
would be lowered without the degrees and so differ from the stored problem), its old ranks all of
degree 1 (plain holdings), the new plan at the recorded degrees.
The freshly traced problem of NEW_DIR is the stored one's graph when its nodes, edges and weights
are the same and every slot type both have holds each weight in the same bytes (its type-free
sizes are the least over the degrees used, which may differ). Every place at one degree is re-planned
the same way (written as a uniform TP plan, or a plain one at degree 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetpart.devices import Cluster
from hetpart.errors import HetpartError
from hetpart.partitioner import Plan, Problem
from hetpart.partitioner.costs import held_weight_bytes
from hetpart.partitioner.problem import Device
from hetpart.partitioner.replan import chosen_plan
from hetpart.partitioner.replan_holdings import Holdings, MixedRank, mixed_holdings
from hetpart.replan import ReplanChoice
from hetpart.tp_machines import places as machine_places


def costed_keys(stored: Problem, old_cluster: Cluster) -> dict[tuple[str, int, Any], str]:
    """(device type, degree, machine link or None at degree 1) -> the stored type key of slots like that."""
    dev = {d.name: d for d in old_cluster.devices}
    link = {m.name: m.link for m in old_cluster.machines}
    out = {}
    for slot in stored.devices:
        names = slot.name.split("+")
        t = len(names)
        out[(dev[names[0]].type.name, t, link[slot.node] if t > 1 else None)] = slot.type
    return out


def _link_text(link: Any) -> str:
    return f"{link.bandwidth_bytes_per_s / 1e9:g} GB/s, {link.latency_s * 1e6:g} us"


def new_places(record: dict, keys: dict[tuple[str, int, Any], str], target: Cluster,
               echo: Callable[[str], None]) -> dict[str, int]:
    """Each place of `target` -> its degree (NOTE [re-plan of mixed degrees])."""
    old = record["degree_of_place"]
    out = {}
    for place, (m, ty, n) in machine_places(target).items():
        if not any(k_ty == ty for (k_ty, _, _) in keys):
            raise HetpartError(
                f"machine '{m.name}' has {n} {ty} device(s), a device type the old plan never costed (it costed "
                f"{', '.join(sorted({k[0] for k in keys}))}): `hetpart replan` keeps the stored costs; partition "
                "from scratch with `hetpart partition ... --cluster NEW` (`run --resume` reads the checkpoint "
                "into any plan)")
        costed = sorted({t for (k_ty, t, link) in keys if k_ty == ty and link in (None, m.link)}, reverse=True)
        elsewhere = sorted({t for (k_ty, t, link) in keys if k_ty == ty} - set(costed))  # on other links only
        was = old.get(place)
        if was is not None and was <= n and was in costed:
            out[place] = was
            continue
        fits = [t for t in costed if t <= n and (was is None or t <= was)]
        relinked = was is not None and was <= n and was in elsewhere  # its degree costed over another link
        if not fits:
            raise HetpartError(
                f"machine '{m.name}' has {n} {ty} device(s)" + (" left" if was is not None else "")
                + (f" (it ran tensor-parallel degree {was})" if was is not None else "")
                + f", and the old plan costed {ty} only at degree(s) {', '.join(map(str, sorted(costed))) or 'none'} "
                f"over its link ({_link_text(m.link)})"
                + (f", degree(s) {', '.join(map(str, elsewhere))} only over another link (a TP group's stored "
                   "costs are for its machine's link)" if elsewhere else "")
                + ": `hetpart replan` keeps the stored costs; partition from scratch for the new cluster (`run "
                "--resume` reads the checkpoint into any plan)")
        out[place] = fits[0]
        if relinked:
            why = (f"its link is now {_link_text(m.link)}, and the stored costs of TP {was} are for the old "
                   f"link: partition from scratch to cost TP {was} over the new one")
        else:
            why = f"{n} device(s) left" if was is not None else ""
        echo(f"note: {place} runs TP {fits[0]}" + (f" (was TP {was}: {why})" if was is not None
                                                   else " (new to the plan)"))
    return out


def mixed_slots(target: Cluster, places: dict[str, int]) -> list[tuple[str, tuple[str, ...], int]]:
    """The slots `partition` makes of `places` on `target` (in its device order): (name, devices, degree), degree 1
    first, as `tensor_parallel.tp_slots` lists them."""
    from hetpart.passes.tp_lower import tp_groups

    out = [(d.name, (d.name,), 1) for d in target.devices if places[f"{d.machine}:{d.type.name}"] == 1]
    for t in sorted({t for t in places.values() if t > 1}):
        out += [(g.name, g.devices, t) for g in tp_groups(target, t) if places[f"{g.machine}:{g.type}"] == t]
    return out


def retarget_mixed(stored: Problem, keys: dict[tuple[str, int, Any], str], target: Cluster,
                   slots: list[tuple[str, tuple[str, ...], int]]) -> Problem:
    """The stored problem on `slots` of `target` (NOTE [re-plan of mixed degrees])."""
    import dataclasses

    from hetpart.passes.lower import cluster_fields

    dev = {d.name: d for d in target.devices}
    link = {m.name: m.link for m in target.machines}
    devices = []
    for name, members, t in slots:
        first = dev[members[0]]
        devices.append(Device(name, keys[(first.type.name, t, link[first.machine] if t > 1 else None)], first.machine,
                              min(dev[d].mem_bytes for d in members)))
    fields = cluster_fields(target, stored.training is not None)
    return dataclasses.replace(stored, devices=devices, intra_node_links=fields["intra_node_links"],
                               network=fields["network"])


def holdings_of_mixed(manifest: dict, record: dict, problem: Problem, slots: list[tuple[str, tuple[str, ...], int]],
                      target: Cluster) -> Holdings:
    """NOTE [re-plan by shard]'s parts of an old plan of any degrees on `slots` (`mixed_holdings`)."""
    from hetpart.runtime.tp import tp_rank, weight_shards

    tp = manifest["mesh"].get("tensor_parallel")  # none: every stage ended on one device (written without TP)
    old = [MixedRank(e["planned_device"], tp_rank(e), tp[e["stage"]]["degree"] if tp else 1, tuple(e["weights"]),
                     frozenset(weight_shards(manifest, e))) for e in manifest["ranks"]]
    state, held, scalar = record["state_bytes"], problem.checkpoint_state, {}
    if held is not None:  # NOTE [bytes from a checkpoint] in replan_checkpoint.py: what the checkpoint holds, whole,
        # its 0-dim state tensors apart (every rank reads them whole)
        state = {w: held.split_bytes(w) if w in held.value_bytes else b for w, b in state.items()}
        scalar = {w: held.scalar_bytes.get(w, 0) for w in state if w in held.value_bytes}
    return mixed_holdings(problem.weights, {s: members for s, members, _ in slots}, {s: t for s, _, t in slots},
                          {int(t): set(ws) for t, ws in record["split"].items()}, state,
                          {d.name: d.machine for d in target.devices}, old, scalar)


class MixedReplanChoice(ReplanChoice):
    """`ReplanChoice` whose check allows the type-free weight sizes of another set of degrees."""

    def plan_for(self, problem: Problem) -> Plan:
        stored = self.stored
        same = set(problem.graph.nodes) == set(stored.graph.nodes) and set(problem.graph.edges) == set(
            stored.graph.edges) and set(problem.weights) == set(stored.weights)
        types = {d.type for d in problem.devices} & {d.type for d in stored.devices}
        if not same or any(held_weight_bytes(problem, w, k) != held_weight_bytes(stored, w, k)
                           for k in types for w in problem.weights):
            raise HetpartError("the model traces to another graph than when the old plan was made (its nodes, edges "
                               "or weights differ): the model changed; partition it from scratch")
        return chosen_plan(problem, self.result.scratch, self.result.plan.stage_of, self.result.plan.device_of_stage)


def replan_mixed_dir(old: Path, out: Path, manifest: dict, plan: Any, stored: Problem, old_cluster: Cluster,
                     target: Cluster, record: dict | None, *, slack: float, time_limit_s: float, seed: int,
                     force: bool, echo: Callable[[str], None], spec: Any, sign_key: Path | None = None) -> Any:
    """`replan` of a plan of mixed tensor-parallel degrees (NOTE [re-plan of mixed degrees]); the CompileResult."""
    from hetpart.codegen.analysis import ANALYSIS
    from hetpart.partitioner.replan_deadline import replan_one
    from hetpart.replan import _write_replan, describe
    from hetpart.replan_tp import keep_groups, old_tp_groups
    from hetpart.tensor_parallel import places_line

    if record is None:
        raise HetpartError(f"{old}/{ANALYSIS} has no tensor_parallel record (its plan of mixed tensor-parallel degrees "
                           "was partitioned by an earlier hetpart): partition again to re-plan it")
    keys = costed_keys(stored, old_cluster)
    places = new_places(record, keys, target, echo)
    groups = old_tp_groups(manifest)
    target = keep_groups(target, groups, places)
    start = time.perf_counter()
    slots = mixed_slots(target, places)
    problem = retarget_mixed(stored, keys, target, slots)
    try:
        result = replan_one(problem, holdings_of_mixed(manifest, record, problem, slots, target), slack=slack,
                            time_limit_s=time_limit_s, seed=seed, old_devices=["+".join(g) for g in groups])
    except HetpartError as err:
        raise HetpartError(f"re-plan of the tensor-parallel degrees per machine ({places_line(places)}): {err}") \
            from None
    kept = all(record["degree_of_place"].get(p) == t for p, t in places.items())  # (a fall or a new place: noted above)
    echo(f"tensor parallel per machine {'kept' if kept else 'now'}: {places_line(places)}; {len(slots)} slot(s), "
         "bytes counted per rank's shard (NOTE [re-plan of mixed degrees])")
    return _write_replan(old, out, manifest, plan, stored, old_cluster, target, result, time.perf_counter() - start,
                         describe, MixedReplanChoice, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key,
                         tensor_parallel_places=tuple(sorted(places.items())))


__all__ = ["MixedReplanChoice", "costed_keys", "mixed_slots", "new_places", "replan_mixed_dir", "retarget_mixed"]
