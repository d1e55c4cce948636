"""`hetpart replan OLD_DIR --cluster NEW | --lose DEVICE ... | --add TYPE@MACHINE ... --out NEW_DIR`.

NOTE [re-plan from the stored analysis]
`partition` writes ir/analysis.json (`write_analysis` in codegen/analysis.py): the lowered, torch-free Problem it solved (every
node's time per device type of its cluster, bytes, weights) and the cluster it planned for. The manifest
hashes it like every file of ir/, and `replan` reads it only through the manifest (`read_listed_json`). From
it `replan` plans without tracing: the problem moved onto the new device set (`retarget`: its devices
and links; the device types must be ones it costed), the from-scratch plan (`solve`) and the
lexicographic one (NOTE [lexicographic re-plan] in partitioner/replan.py), with the bytes each moves,
all within one deadline of `--time-limit` (NOTE [re-plan deadline] in partitioner/replan_deadline.py).
What it does not keep is the FX graph the stages' code is cut from: writing NEW_DIR's rank modules
traces the model again (`compile_model` with the chosen plan in place of its solve, `ReplanChoice`),
which checks that the graph lowers to the same nodes and edges as the stored problem (the model is
unchanged) and applies the plan to it. A device is the same device in both clusters when it has the
same name (machine/index): `--lose` and `--add` keep every other device's name.
A plan of data-parallel pipelines (plan.json's `pipelines`) also stores each pipeline's cuts and
devices (ir/pipelines.json, `write_pipelines_record`); its re-plan is NOTE [re-plan pipelines]
(partitioner/replan_pipelines.py), written by `compile_pipelines` with `PipelinesChoice` in place of its search.
A plan of tensor-parallel stages is re-planned at its degree: NOTE [re-plan of tensor-parallel plans] (replan_tp.py);
one of degrees mixed per machine at each machine's: NOTE [re-plan of mixed degrees] (replan_mixed.py).

NOTE [re-plan of a signed plan]
NEW_DIR is code as OLD_DIR is (NOTE [artifacts are code] in trust.py), and `replan` writes it unsigned unless
given `--sign-key KEY`, with `partition --sign-key`'s rules: a key of at least 32 bytes, outside NEW_DIR (and
outside OLD_DIR). Where OLD_DIR is signed, the key checks OLD_DIR's signature first (manifest.json, before
anything of it is read), so it never signs a plan made from a directory whose signature it did not check; OLD_DIR
signed with another key is refused. An unsigned OLD_DIR (or one whose manifest.json.hmac was removed) has no
signature to check, only its manifest's hashes, which whoever can change it can rewrite: NEW_DIR is signed all the
same (a plan partitioned unsigned may be re-planned signed), and `replan` says so in its last line (rev25 found
it silent). Without --sign-key, a signed OLD_DIR gets a NEW_DIR without a signature, which `run --key` refuses:
`replan` says so in its last line (review23 found it silent).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetpart.codegen.analysis import ANALYSIS, ANALYSIS_VERSION, cluster_from_json
from hetpart.devices import Cluster, load_cluster
from hetpart.devices.catalog import CATALOG
from hetpart.devices.cluster import ClusterDevice, Machine, with_reserve
from hetpart.errors import HetpartError
from hetpart.fsio import replaces_input
from hetpart.partitioner import Plan, Problem
from hetpart.partitioner.problem_json import costed_types, problem_from_json
from hetpart.partitioner.replan import LARGE_STATUSES, Replan, chosen_plan, holders_of
from hetpart.partitioner.replan_deadline import replan_one
from hetpart.units import format_bytes

def new_cluster(old: Cluster, spec: str | None, lose: tuple[str, ...], add: tuple[str, ...]) -> Cluster:
    """The device set to re-plan for: `--cluster`, or the old cluster less `lose` plus `add` (TYPE@MACHINE)."""
    if spec is not None:
        if lose or add:
            raise HetpartError("--cluster gives the whole new device set; leave out --lose and --add with it")
        return with_reserve(load_cluster(spec), old.memory_reserve_bytes)  # NOTE [memory reserve]
    if not lose and not add:
        raise HetpartError("say what changed: --cluster NEW_CLUSTER, or --lose DEVICE ... and/or --add TYPE@MACHINE")
    names = [d.name for d in old.devices]
    for name in lose:
        if name not in names:
            raise HetpartError(f"--lose {name}: the old cluster has no such device (its devices: {', '.join(names)})")
    machines = {m.name: list(m.devices) for m in old.machines}
    added: set[str] = set()
    for item in add:
        type_name, _, machine = item.partition("@")
        if machine not in machines:
            raise HetpartError(f"--add {item}: expected TYPE@MACHINE with a machine of the old cluster "
                               f"({', '.join(machines)}); for a new machine pass --cluster FILE")
        dtype = old.device_types.get(type_name) or CATALOG.get(type_name)
        if dtype is None:
            raise HetpartError(f"--add {item}: unknown device type '{type_name}' (see `hetpart devices`)")
        taken = [int(d.name.rsplit("/", 1)[1]) for d in machines[machine] if d.name.rsplit("/", 1)[1].isdigit()]
        name = f"{machine}/{max(taken, default=-1) + 1}"
        added.add(name)
        machines[machine].append(ClusterDevice(name, dtype, machine, dtype.mem_bytes))
    kept = tuple(Machine(m.name, tuple(d for d in machines[m.name] if d.name not in lose), m.link)
                 for m in old.machines)
    kept = tuple(m for m in kept if m.devices)
    if not kept:
        raise HetpartError("--lose removes every device: nothing is left to plan for")
    # NOTE [memory reserve]: the old devices have it off already, the added ones get it here
    return with_reserve(Cluster(f"{old.name}-replan", kept, old.network), old.memory_reserve_bytes, fresh=added)


def retarget(stored: Problem, cluster: Cluster) -> Problem:
    """The stored problem on `cluster`'s devices and links (NOTE [re-plan from the stored analysis])."""
    from hetpart.passes.lower import cluster_fields

    missing = sorted({d.type.name for d in cluster.devices} - costed_types(stored))
    if missing:
        raise HetpartError(f"device type(s) {', '.join(missing)} of the new cluster were not costed when the old "
                           f"plan was made (costed: {', '.join(sorted(costed_types(stored)))}); plan from scratch "
                           "with `hetpart partition ... --cluster NEW`")
    # A new Problem (replace runs __init__), so no cached device index or slots of the old devices carry over.
    return dataclasses.replace(stored, **cluster_fields(cluster, stored.training is not None))


def check_same_graph(stored: Problem, problem: Problem) -> None:
    """An error unless the freshly traced `problem` is the `stored` one's graph (the model is unchanged)."""
    fresh, old = problem.graph, stored.graph
    if set(fresh.nodes) != set(old.nodes) or set(fresh.edges) != set(old.edges) or problem.weights != stored.weights:
        raise HetpartError("the model traces to another graph than when the old plan was made (its nodes, edges "
                           "or weights differ): the model changed; partition it from scratch")


@dataclass
class ReplanChoice:
    """The re-plan's choice, for `compile_model` to apply in place of its solve (NOTE [re-plan from the
    stored analysis]); `record` goes to plan.json's `replan`."""

    stored: Problem
    result: Replan
    record: dict[str, Any]

    def plan_for(self, problem: Problem) -> Plan:
        """The chosen plan on the freshly traced `problem`, which must be the stored one's graph."""
        check_same_graph(self.stored, problem)
        return chosen_plan(problem, self.result.scratch, self.result.plan.stage_of, self.result.plan.device_of_stage)


def describe(result: Replan, plan_s: float, lost: list[str]) -> list[str]:
    """What `hetpart replan` prints: both plans, the bytes each moves and the predicted move time."""
    lines = [f"re-planned in {plan_s:.2f} s from the stored analysis (no trace)"
             + (f"; lost: {', '.join(lost)}" if lost else "")]
    rows = [("from scratch", result.scratch, result.scratch_moves), ("chosen", result.plan, result.moves)]
    lines.append(f"  {'plan':<13} {'bottleneck':>11} {'stages':>6}  {'between machines':>16} "
                 f"{'within machines':>15} {'from checkpoint':>15} {'move time':>10}  devices")
    for name, plan, mv in rows:
        lines.append(f"  {name:<13} {plan.bottleneck_ns / 1000:>8.1f} us {len(plan.stages):>6}  "
                     f"{format_bytes(mv.between_bytes):>16} {format_bytes(mv.within_bytes):>15} "
                     f"{format_bytes(mv.checkpoint_bytes):>15} "
                     f"{mv.time_ns / 1e6:>7.3f} ms  {' '.join(plan.device_of_stage)}")
    for key in sorted(result.moves.link_bytes):
        lines.append(f"  chosen plan's link {key}: {format_bytes(result.moves.link_bytes[key])}, "
                     f"{result.moves.link_time_ns[key] / 1e6:.3f} ms (costs.transfer_ns)")
    lines.append(f"  slack {result.slack:.0%}: bottleneck limit {result.limit_ns / 1000:.1f} us "
                 f"(from scratch {result.scratch.bottleneck_ns / 1000:.1f} us, gap {result.scratch.gap:.2%}); "
                 + (f"{' / '.join(result.status)} (NOTE [large re-plan])" if result.status[0] in LARGE_STATUSES
                    else f"CP-SAT {' / '.join(result.status)}"))
    return lines


def replan(old: Path, out: Path, *, cluster: str | None = None, lose: tuple[str, ...] = (),
           add: tuple[str, ...] = (), slack: float = 0.02, time_limit_s: float = 30.0, seed: int = 0,
           force: bool = False, echo: Callable[[str], None] = print, model: str | None = None,
           trust_model_file: bool = False, checkpoint: Path | None = None, sign_key: Path | None = None) -> Any:
    """Re-plan OLD_DIR for the new device set and write NEW_DIR; the CompileResult. `model`, `trust_model_file`:
    a file model's consent to import it, as `run` takes it (NOTE [model files] in runtime/artifacts.py);
    `checkpoint`: a run of OLD_DIR's, whose bytes are counted (NOTE [bytes from a checkpoint]); `sign_key`: a
    key file signing NEW_DIR, as `partition --sign-key` (NOTE [re-plan of a signed plan])."""
    from hetpart.codegen.publish import check_out
    from hetpart.plan_report import as_json
    from hetpart.replan_checkpoint import read_held_state
    from hetpart.runtime.artifacts import check_listed_files, load_manifest, model_spec_for_run, read_listed_json
    from hetpart.runtime.artifacts import read_plan
    from hetpart.runtime.tp import is_mixed, is_tp
    from hetpart.trust import check_key_outside, is_signed, read_key

    if replaces_input(out, {"OLD_DIR": old}):  # NOTE [an output is no input] in fsio.py; --force or not
        real = Path(os.path.abspath(old)).resolve()
        raise HetpartError(f"--out {out} {'is' if Path(os.path.abspath(out)).resolve() == real else 'holds'} "
                           f"OLD_DIR {old}, the plan this re-plan reads: writing there would replace the old plan, "
                           "and the logs/ and measured.json of its runs; nothing was changed: pass a new --out "
                           f"(such as {real}-replan)")
    key = read_key(sign_key, out) if sign_key is not None else None  # NOTE [re-plan of a signed plan]
    if key is not None:
        check_key_outside(sign_key, old, "whose signature it checks (OLD_DIR)")  # nor inside OLD_DIR, which it checks
    manifest = load_manifest(old, key if key is not None and is_signed(old) else None,
                             advice="re-plan from it only with the key that signed it (--sign-key), or from a "
                                    f"directory you trust: `hetpart replan` plans from {old}'s plan and analysis")
    plan = read_plan(old, manifest)
    check_listed_files(old, manifest)
    check_out(out, force)  # NEW_DIR as `partition` checks it, before the re-plan prints a plan it could not write
    spec = model_spec_for_run(plan, model, trust_model_file, echo, "replan")  # writing NEW_DIR traces it: before any solve
    if plan.virtual_stages is not None:
        raise HetpartError(f"{old} runs {plan.virtual_stages} virtual stages per device (an interleaved schedule), "
                           "which `hetpart replan` does not re-plan (NOTE [re-plan of tensor-parallel plans] says "
                           "why): partition from scratch for the new cluster; `run --resume` reads this checkpoint "
                           "into it")
    if ANALYSIS not in manifest["files"]:
        raise HetpartError(f"{old} has no {ANALYSIS} (partitioned by an earlier hetpart); partition again to re-plan")
    data = read_listed_json(old, manifest, ANALYSIS)
    if data.get("version") != ANALYSIS_VERSION:
        raise HetpartError(f"{old}/{ANALYSIS}: version {data.get('version')}, this hetpart reads {ANALYSIS_VERSION}")
    stored, old_cluster = problem_from_json(data["problem"]), cluster_from_json(data["cluster"])
    if checkpoint is not None:  # NOTE [bytes from a checkpoint]: every engine reads a weight's bytes from `stored`
        stored = dataclasses.replace(stored, checkpoint_state=read_held_state(checkpoint, old, manifest,
                                                                              as_json(plan.model), stored))
    target = new_cluster(old_cluster, cluster, lose, add)
    if plan.pipelines is not None:  # data-parallel pipelines: NOTE [re-plan pipelines] (of TP stages: NOTE [re-plan
        # of tensor-parallel pipelines] in replan_tp.py)
        return replan_pipelines_dir(old, out, manifest, plan, stored, old_cluster, target, slack=slack,
                                    time_limit_s=time_limit_s, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key)
    if is_mixed(manifest) or "tensor_parallel" in data:  # NOTE [re-plan of mixed degrees], its TP stages or none
        from hetpart.replan_mixed import replan_mixed_dir

        return replan_mixed_dir(old, out, manifest, plan, stored, old_cluster, target, data.get("tensor_parallel"),
                                slack=slack, time_limit_s=time_limit_s, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key)
    if is_tp(manifest):  # NOTE [re-plan of tensor-parallel plans]
        return replan_tp_dir(old, out, manifest, plan, stored, old_cluster, target, slack=slack,
                             time_limit_s=time_limit_s, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key)
    start = time.perf_counter()
    problem = retarget(stored, target)
    result = replan_one(problem, holders_of(manifest["ranks"]), slack=slack, time_limit_s=time_limit_s, seed=seed,
                        old_devices=[e["planned_device"] for e in manifest["ranks"]])
    return _write_replan(old, out, manifest, plan, stored, old_cluster, target, result, time.perf_counter() - start,
                         describe, ReplanChoice, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key)


def replan_tp_dir(old: Path, out: Path, manifest: dict, plan: Any, stored: Problem, old_cluster: Cluster,
                  target: Cluster, *, slack: float, time_limit_s: float, seed: int, force: bool,
                  echo: Callable[[str], None], spec: Any, sign_key: Path | None = None) -> Any:
    """`replan` of a plan of tensor-parallel stages at its degree (NOTE [re-plan of tensor-parallel plans])."""
    from hetpart.replan_tp import tp_slots

    start = time.perf_counter()
    slots = tp_slots(old, manifest, stored, old_cluster, target)
    try:
        result = replan_one(slots.problem, slots.holdings, slack=slack, time_limit_s=time_limit_s, seed=seed,
                            old_devices=["+".join(g) for g in slots.old_groups])
    except HetpartError as err:
        raise HetpartError(f"re-plan at tensor-parallel degree {slots.degree} (kept from {old}): {err}") from None
    echo(_kept_line(slots))
    return _write_replan(old, out, manifest, plan, stored, old_cluster, slots.target, result,
                         time.perf_counter() - start, describe, ReplanChoice, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key,
                         tensor_parallel=slots.degree)


def _kept_line(slots: Any) -> str:
    """What `replan` prints of a TP plan's slots (a `replan_tp.TPSlots`)."""
    return (f"tensor parallel {slots.degree} kept: {len(slots.problem.devices)} group(s) of the new cluster "
            f"({', '.join(d.name for d in slots.problem.devices)}); bytes counted per TP rank's shard "
            "(NOTE [re-plan by shard])")


def _write_replan(old: Path, out: Path, manifest: dict, plan: Any, stored: Problem, old_cluster: Cluster,
                  target: Cluster, result: Any, plan_s: float,
                  describe_fn: Callable[[Any, float, list[str]], list[str]],
                  choice: Callable[[Problem, Any, dict], Any], *, seed: int, force: bool, echo: Callable[[str], None],
                  spec: Any, sign_key: Path | None = None, **options: Any) -> Any:
    """Print a re-plan's `result` (`describe_fn`) and how its bytes were counted, record it, and write NEW_DIR
    with it in place of the solve (`choice`: ReplanChoice or PipelinesChoice), signed with `sign_key`; the old
    plan's options otherwise, `options` on top."""
    from hetpart.compile import CompileOptions, compile_model
    from hetpart.replan_checkpoint import basis_line, basis_record, planned_optimizer_bytes

    lost = sorted({d.name for d in old_cluster.devices} - {d.name for d in target.devices})
    added = sorted({d.name for d in target.devices} - {d.name for d in old_cluster.devices})
    for line in describe_fn(result, plan_s, lost):
        echo(line + (f"; added: {', '.join(added)}" if added and line.startswith("re-planned ") else ""))
    basis = basis_line(stored.checkpoint_state, plan)  # NOTE [bytes from a checkpoint]
    if basis is not None:
        echo(basis)
    record = {**result.to_json(), "from": str(old), "lost": lost, "replan_s": round(plan_s, 3),
              "bytes_counted": basis_record(stored.checkpoint_state, plan)}
    opts = CompileOptions(microbatches=plan.microbatches, seed=seed, force=force, mode=plan.mode,
                          schedule=plan.schedule, optimizer_bytes_per_param=planned_optimizer_bytes(plan),
                          sign_key=sign_key,
                          pt2=any("stage.pt2" in e["files"] for e in manifest["ranks"]),
                          meta=plan.weights == "manifest", align=plan.align, replan=choice(stored, result, record),
                          **options)
    return compile_model(spec, target, out, opts, echo=echo)  # `spec`: the model `replan` may build (its --model)


# --- Data-parallel pipelines (NOTE [re-plan pipelines] in partitioner/replan_pipelines.py).

@dataclass
class PipelinesChoice:
    """A pipelines re-plan's choice, for `compile_pipelines` to write in place of its search."""

    stored: Problem
    result: Any  # partitioner.replan_pipelines.PipelinesReplan
    record: dict[str, Any]
    memo: Any = None  # the solved shapes the re-plan's search started from and made, for NEW_DIR (NOTE [shape memo])

    def pipelines_for(self, problem: Problem) -> Any:
        """The chosen pipelines on the freshly traced `problem` (the stored graph: `ReplanChoice.plan_for`'s
        check), re-costed; their bound is the from-scratch plan's, which holds for every plan of the cluster."""
        from hetpart.partitioner.pipelines import Pipeline, cost_pipelines, pipeline_time_ns
        from hetpart.partitioner.replan_pipelines import pipeline_plan

        check_same_graph(self.stored, problem)
        chosen = self.result.chosen.plan
        scratch = self.result.scratch.plan if self.result.scratch is not None else None
        pipes = []
        for p in chosen.pipelines:
            plan = pipeline_plan(problem, p.devices, p.plan.stage_of, p.plan.slot_of_stage, p.microbatches)
            pipes.append(Pipeline(p.index, p.devices, p.microbatches, plan, pipeline_time_ns(plan, p.microbatches)))
        # (the from-scratch note is quoted whole: where that plan was a baseline's, it says so of that plan)
        bound = (f"the bound is the from-scratch plan's, whose own note reads \"{scratch.bound_note}\""
                 if scratch is not None else
                 "no bound: the from-scratch search found no plan")
        # the bound's parts cut by its deadline are the from-scratch bound's, as its note says (plan.json's
        # bound_unfinished)
        out = cost_pipelines(problem, pipes, lower_bound_ns=scratch.lower_bound_ns if scratch is not None else 0,
                             solver_status="FEASIBLE",
                             bound_note=f"re-planned (NOTE [re-plan pipelines]): {self.result.chosen.name}; {bound}"
                             + "".join(f"; left out at --time-limit: {x}" for x in self.result.left_out),
                             bound_unfinished=scratch.bound_unfinished if scratch is not None else ())
        out.devices_idle = dict(self.result.devices_idle)  # NOTE [re-plan idle reasons]: the same devices idle
        return out


def describe_pipelines(result: Any, plan_s: float, lost: list[str]) -> list[str]:
    """What `hetpart replan` prints for pipelines: every candidate, the bytes each moves, the chosen one's links."""
    lines = [f"re-planned {len(result.candidates)} candidates in {plan_s:.2f} s from the stored analysis (no trace)"
             + (f"; lost: {', '.join(lost)}" if lost else "")]
    lines.append(f"  {'':1} {'candidate':<52} {'iteration':>11} {'between machines':>16} {'within machines':>15} "
                 f"{'from checkpoint':>15} {'move time':>10}")
    for c in result.candidates:
        mark = "*" if c is result.chosen else ("-" if c.plan.iteration_ns > result.limit_ns else " ")
        mv = c.moves
        lines.append(f"  {mark} {c.name[:52]:<52} {c.plan.iteration_ns / 1000:>8.1f} us "
                     f"{format_bytes(mv.between_bytes):>16} {format_bytes(mv.within_bytes):>15} "
                     f"{format_bytes(mv.checkpoint_bytes):>15} {mv.time_ns / 1e6:>7.3f} ms")
    for p, how in zip(result.chosen.plan.pipelines, result.chosen.how):
        lines.append(f"  chosen pipeline {p.index} ({how}): {p.microbatches} microbatches on "
                     f"{' '.join(p.plan.slot_of_stage)}")
    for key in sorted(result.chosen.moves.link_bytes):
        lines.append(f"  chosen plan's link {key}: {format_bytes(result.chosen.moves.link_bytes[key])}, "
                     f"{result.chosen.moves.link_time_ns[key] / 1e6:.3f} ms (costs.transfer_ns)")
    scratch = result.scratch.plan if result.scratch is not None else None
    ref = ("no from-scratch plan" if scratch is None else f"from scratch {scratch.iteration_ns / 1000:.1f} us, its "
           f"bound {scratch.lower_bound_ns / 1000:.1f} us, gap {scratch.gap:.2%}")
    lines.append(f"  slack {result.slack:.0%}: iteration limit {result.limit_ns / 1000:.1f} us (best candidate "
                 f"{result.best_ns / 1000:.1f} us; {ref}); '*' chosen: the fewest bytes "
                 "between machines, then within, of those within the limit ('-': over it); NOTE [re-plan pipelines]")
    if result.left_out:
        lines.append(f"  left out at the --time-limit: {'; '.join(result.left_out)} (NOTE [re-plan deadline])")
    return lines


def replan_pipelines_dir(old: Path, out: Path, manifest: dict, plan: Any, stored: Problem, old_cluster: Cluster,
                         target: Cluster, *, slack: float, time_limit_s: float, seed: int, force: bool,
                         echo: Callable[[str], None], spec: Any, sign_key: Path | None = None) -> Any:
    """`replan` of a plan of data-parallel pipelines (NOTE [re-plan pipelines]); the CompileResult."""
    from hetpart.codegen.pipelines_record import PIPELINES_RECORD, SHAPE_MEMO
    from hetpart.partitioner.replan_deadline import replan_pipelines_within
    from hetpart.partitioner.replan_pipelines import pipelines_from_json
    from hetpart.partitioner.shape_memo import ShapeMemo
    from hetpart.runtime.artifacts import read_listed_json
    from hetpart.runtime.tp import is_mixed, is_tp, tp_degrees

    if PIPELINES_RECORD not in manifest["files"]:
        raise HetpartError(f"{old} has no {PIPELINES_RECORD} (its pipelines were partitioned by an earlier hetpart); "
                           "partition again to re-plan")
    old_pipes = pipelines_from_json(read_listed_json(old, manifest, PIPELINES_RECORD),
                                    str(old / PIPELINES_RECORD))
    start = time.perf_counter()
    # NOTE [shape memo]: the old search's solved shapes, read through the manifest (hashed as all of ir/).
    memo = ShapeMemo.from_json(read_listed_json(old, manifest, SHAPE_MEMO), str(
        old / SHAPE_MEMO)) if SHAPE_MEMO in manifest["files"] else ShapeMemo("")
    options: dict[str, Any] = {}
    if is_tp(manifest):  # pipelines of TP stages, re-planned over TP slots: NOTE [re-plan of tensor-parallel pipelines]
        from hetpart.replan_tp import tp_slots

        if is_mixed(manifest):  # NOTE [re-plan of tensor-parallel pipelines]: one degree's slots only
            raise HetpartError(
                f"{old} runs data-parallel pipelines planned over tensor-parallel slots of degrees "
                f"{tp_degrees(manifest)} "
                "(--tensor-parallel MACHINE=T), which `hetpart replan` does not re-plan "
                "(NOTE [re-plan of tensor-parallel pipelines] says why): partition the model again for the new "
                "cluster (`hetpart partition ... --cluster NEW --out NEW_DIR`), then `hetpart run NEW_DIR --resume "
                "CHECKPOINT` reads this plan's checkpoint into it")
        slots = tp_slots(old, manifest, stored, old_cluster, target)
        problem, holders, target, options["tensor_parallel"] = slots.problem, slots.holdings, slots.target, slots.degree
        echo(_kept_line(slots))
    else:
        problem, holders = retarget(stored, target), holders_of(manifest["ranks"])
    result, _ = replan_pipelines_within(problem, old_pipes, holders, plan.microbatches,
                                        slack=slack, time_limit_s=time_limit_s, seed=seed, echo=echo, memo=memo)
    if memo.ignored:
        echo(f"note: {old / SHAPE_MEMO} is another problem's (the model, its costs or the schedule changed): "
             "not used; the search started afresh")
    elif memo.seeded:
        echo(f"the from-scratch search started from {memo.seeded} plan(s) of {old / SHAPE_MEMO} (NOTE [shape memo])")
    choice = lambda stored_, result_, record: PipelinesChoice(stored_, result_, record, memo)  # noqa: E731
    return _write_replan(old, out, manifest, plan, stored, old_cluster, target, result, time.perf_counter() - start,
                         describe_pipelines, choice, seed=seed, force=force, echo=echo, spec=spec, sign_key=sign_key, parallel="data", **options)
