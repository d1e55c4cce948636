"""Replay a synthetic spot-availability trace over a partitioned model: re-plan at each event (issue 21).

    .venv/bin/python benchmarks/spot_trace.py /tmp/spot/l7 [/tmp/spot/l70 ...] --events 8 --time-limit 2

Each DIR is a `hetpart partition` output (its ir/analysis.json: NOTE [re-plan from the stored analysis] in
hetpart/replan.py). The trace: machines (8 GPUs each in preset:hetero-64) are preempted one at a time and
come back, as spot instances are (a whole instance is reclaimed, with a notice: AWS EC2 gives two minutes,
docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html; GCP Spot VMs 30 s,
cloud.google.com/compute/docs/instances/spot). Event times are exponential with a per-machine rate
(`--preemptions-per-machine-day`; AWS's Spot Instance Advisor puts the most interrupted instance types at
">20%" a month, which is 0.0067 a day: the default 1.0 a day is a stress trace, many times that). A
preempted machine returns after an exponential `--return-hours`.

At each event, for the devices alive: the from-scratch plan (`solve`) and the re-plan (NOTE [lexicographic
re-plan] in hetpart/partitioner/replan.py, the old plan's devices holding the state), both within one
deadline of `--time-limit` (NOTE [re-plan deadline]), as `hetpart replan --time-limit` runs them. The
re-plan is judged against a reference made apart from it: the from-scratch plan a user gets from `hetpart
partition` (`--reference-time-limit`, default 30 s, partition's default; the better of it and the re-plan's
own in-deadline one), which is the "re-planning from scratch" of issue 21 (its bytes, "re-sharding
everything", its step, "the from-scratch optimum", and the restart policy's plan and solve time). With
`--reference-time-limit 0` the in-deadline plan is the reference, as before (a reference found in a
fraction of 2 s can be far weaker: the 7B's data-parallel one was one replica where 30 s finds six, and the
bytes of re-sharding it read 6x too few).
Printed per event: re-plan time (retarget + both solves; wall and this process's CPU seconds), bytes moved
by the re-plan (and the floor: the state no surviving device holds, which any plan reads from the
checkpoint), by the from-scratch plan, and by re-sharding everything (every stage's state read again),
the re-plan's bottleneck over the from-scratch one's; then a markdown table, the summary and the verdicts
against issue 21's done-when (5 s per event, 3x fewer bytes, 3% of the from-scratch bottleneck). Goodput over the trace: samples trained per second of trace, where each event stops
training for its plan time plus its move time (the slowest link, costs.transfer_ns), and both policies lose
the same steps since the last checkpoint (left out of both); "restart" re-plans from scratch and re-reads
every stage's state from the checkpoint over the network.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hetpart.codegen.analysis import ANALYSIS, cluster_from_json  # noqa: E402
from hetpart.codegen.pipelines_record import PIPELINES_RECORD, SHAPE_MEMO  # noqa: E402
from hetpart.devices import Cluster  # noqa: E402
from hetpart.errors import HetpartError  # noqa: E402
from hetpart.partitioner.costs import transfer_ns  # noqa: E402
from hetpart.partitioner.problem_json import problem_from_json  # noqa: E402
from hetpart.partitioner.replan import (  # noqa: E402
    holders_of, lost_state_bytes, stage_weights, state_to_move_bytes,
)
from hetpart.partitioner.replan_deadline import replan_one  # noqa: E402
from hetpart.partitioner.solve import solve  # noqa: E402
from hetpart.replan import retarget  # noqa: E402


def trace(machines: list[str], events: int, rate_per_day: float, return_hours: float, seed: int) -> list[tuple]:
    """(time_s, "lose"|"add", machine) events: each alive machine preempted at `rate_per_day`, back after
    an exponential `return_hours`; never fewer than two machines alive."""
    rng = random.Random(seed)
    alive, back, now, out = set(machines), {}, 0.0, []
    while len(out) < events:
        rate = len(alive) * rate_per_day / 86400
        t_lose = now + rng.expovariate(rate) if rate > 0 and len(alive) > 2 else float("inf")
        t_back, m_back = min(((t, m) for m, t in back.items()), default=(float("inf"), None))
        if t_back < t_lose:
            now = t_back
            del back[m_back]
            alive.add(m_back)
            out.append((now, "add", m_back))
        else:
            now = t_lose
            m = rng.choice(sorted(alive))
            alive.discard(m)
            back[m] = now + rng.expovariate(1 / (return_hours * 3600))
            out.append((now, "lose", m))
    return out


def on_machines(full: Cluster, alive: set[str]) -> Cluster:
    return Cluster(full.name, tuple(m for m in full.machines if m.name in alive), full.network)


def resharding_bytes(problem, plan) -> int:
    """Every stage's state read again (restart from the checkpoint)."""
    return sum(state_to_move_bytes(problem, w) for ws in stage_weights(problem, plan.stage_of).values() for w in ws)


def _train_until(good: dict[str, float], rows: list[dict], since_s: float, step_s: float,
                 samples_per_step: int) -> None:
    """Each policy's samples trained in the `since_s` since the last event: the time it was not stopped (its
    last row's `_down_s`), at the step time of the plan it then ran (the first plan's `step_s` / its `_speed`)."""
    for policy in good:
        down_s = rows[-1][policy + "_down_s"] if rows else 0.0
        speed = rows[-1][policy + "_speed"] if rows else 1.0
        good[policy] += max(0.0, since_s - down_s) / step_s * samples_per_step * speed


def _replayed(plan_json: dict, rows: list[dict], end_s: float, good: dict[str, float], first_plan: float) -> dict:
    """The replay's result; `first_plan`: the samples the first plan would have trained by `end_s` unstopped
    (hetpart's goodput over it measures the re-plans' quality without the from-scratch reference)."""
    return {"model": plan_json["model"]["model"], "rows": rows, "trace_h": round(end_s / 3600, 2),
            "goodput_ratio": round(good["hetpart"] / good["restart"], 4) if good["restart"] else None,
            "goodput_vs_first_plan": round(good["hetpart"] / first_plan, 4) if first_plan else None}


def replay(path: Path, args: argparse.Namespace) -> dict:
    data = json.loads((path / ANALYSIS).read_text())
    stored, full = problem_from_json(data["problem"]), cluster_from_json(data["cluster"])
    plan_json = json.loads((path / "plan.json").read_text())
    manifest = json.loads((path / "manifest.json").read_text())
    if "pipelines" in plan_json:  # data-parallel pipelines: NOTE [re-plan pipelines]
        return replay_pipelines(path, stored, full, plan_json, manifest, args)
    holders = holders_of(manifest["ranks"])
    old_devices = [r["planned_device"] for r in manifest["ranks"]]
    samples_per_step = plan_json["microbatch_size"] * plan_json["microbatches"]
    m = plan_json["microbatches"]
    alive = {mc.name for mc in full.machines}
    events = trace(sorted(alive), args.events, args.preemptions_per_machine_day, args.return_hours, args.seed)
    rows, prev_t = [], 0.0
    bottleneck_ns = plan_json["bottleneck_us"] * 1000
    good = {"hetpart": 0.0, "restart": 0.0}
    step_s = bottleneck_ns * 1e-9 * (m + len(plan_json["stages"]) - 1)  # GPipe fill + drain, per step
    for t, kind, machine in events:
        _train_until(good, rows, t - prev_t, step_s, samples_per_step)
        (alive.discard if kind == "lose" else alive.add)(machine)
        start, cpu = time.perf_counter(), time.process_time()
        problem = retarget(stored, on_machines(full, alive))
        result = replan_one(problem, holders, slack=args.slack, time_limit_s=args.time_limit, seed=args.seed,
                            old_devices=old_devices)  # one deadline for both (NOTE [re-plan deadline])
        replan_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
        scratch, scratch_s = result.scratch, replan_s - result.seconds
        restart_s = scratch_s  # the restart policy's solve
        if args.reference_time_limit > 0:  # the user's from-scratch plan, made apart from the timed re-plan
            ref_start = time.perf_counter()
            ref = solve(problem, time_limit_s=args.reference_time_limit, seed=args.seed)
            if ref.bottleneck_ns < scratch.bottleneck_ns:
                scratch, restart_s = ref, time.perf_counter() - ref_start
        floor = lost_state_bytes(problem, holders)
        reshard = resharding_bytes(problem, scratch)
        reshard_ns = max(transfer_ns(problem.network, reshard // max(1, len(alive))), 0)  # every machine reads its own
        chosen = result.moves
        rows.append({
            "t_h": round(t / 3600, 2), "event": f"{kind} {machine}", "devices": len(problem.devices),
            "stages": len(result.plan.stages), "replan_s": round(replan_s, 2), "cpu_s": round(cpu_s, 2),
            "scratch_solve_s": round(scratch_s, 2),
            "moved_GiB": round((chosen.between_bytes + chosen.within_bytes + chosen.checkpoint_bytes) / 2**30, 2),
            "between_GiB": round(chosen.between_bytes / 2**30, 2),
            "network_GiB": round((chosen.between_bytes + chosen.checkpoint_bytes) / 2**30, 2),
            "scratch_between_GiB": round(result.scratch_moves.between_bytes / 2**30, 2),
            "lexicographic_s": round(replan_s - scratch_s, 2), "move_s": round(chosen.time_ns * 1e-9, 3),
            "scratch_moved_GiB": round(sum((result.scratch_moves.between_bytes, result.scratch_moves.within_bytes,
                                            result.scratch_moves.checkpoint_bytes)) / 2**30, 2),
            "reshard_GiB": round(reshard / 2**30, 2), "floor_GiB": round(floor / 2**30, 2),
            "moved_B": chosen.between_bytes + chosen.within_bytes + chosen.checkpoint_bytes, "reshard_B": reshard,
            "bottleneck_ratio": round(result.plan.bottleneck_ns / scratch.bottleneck_ns, 4),
            "scratch_gap": round(scratch.gap, 4), "status": "/".join(result.status),
            "hetpart_down_s": replan_s + chosen.time_ns * 1e-9,
            "restart_down_s": restart_s + reshard_ns * 1e-9,
            "hetpart_speed": bottleneck_ns / result.plan.bottleneck_ns,
            "restart_speed": bottleneck_ns / scratch.bottleneck_ns,
        })
        holders = {w: tuple(result.plan.device_of_stage[k] for k, ws in
                            stage_weights(problem, result.plan.stage_of).items() if w in ws) for w in stored.weights}
        old_devices = result.plan.device_of_stage
        prev_t = t
        print(json.dumps(rows[-1]), flush=True)
    return _replayed(plan_json, rows, prev_t, good, prev_t / step_s * samples_per_step)


def pipelines_holders(problem, pp) -> dict[str, tuple[str, ...]]:
    """weight -> the devices of every pipeline's stages that hold it."""
    out: dict[str, list[str]] = {}
    for p in pp.pipelines:
        for k, ws in stage_weights(problem, p.plan.stage_of).items():
            for w in ws:
                out.setdefault(w, []).append(p.plan.slot_of_stage[k])
    return {w: tuple(ds) for w, ds in out.items()}


def _no_plan_row(t: float, kind: str, machine: str, problem, wall_s: float, cpu_s: float, why: str) -> dict:
    """An event after which no plan runs the batch: nothing moves, both policies stop until the next event."""
    return {"t_h": round(t / 3600, 2), "event": f"{kind} {machine}", "devices": len(problem.devices), "stages": "-",
            "scratch_stages": "none", "replan_s": round(wall_s, 2), "cpu_s": round(cpu_s, 2),
            "scratch_solve_s": round(wall_s, 2), "lexicographic_s": 0.0, "move_s": 0.0, "moved_GiB": 0.0,
            "between_GiB": 0.0, "network_GiB": 0.0, "scratch_moved_GiB": 0.0, "reshard_GiB": 0.0, "floor_GiB": 0.0,
            "moved_B": 0, "reshard_B": 0, "reread_chosen_B": 0, "bottleneck_ratio": 1.0, "scratch_gap": 1.0,
            "status": f"no plan: {why.splitlines()[0][:90]}", "hetpart_down_s": 0.0, "restart_down_s": 0.0,
            "hetpart_speed": 0.0, "restart_speed": 0.0, "no_plan": True}


@dataclass
class PriorReference:
    """A reference plan read from an earlier run's rows (`--references`): its step and gap."""

    iteration_ns: int
    gap: float


def replay_pipelines(path: Path, stored, full: Cluster, plan_json: dict, manifest: dict,
                     args: argparse.Namespace) -> dict:
    """`replay` of a plan of data-parallel pipelines: at each event the from-scratch `--parallel data` plan
    (`plan_with_baselines`, as `hetpart replan` makes it) and NOTE [re-plan pipelines]'s choice."""
    from hetpart.partitioner.pipeline_search import plan_with_baselines
    from hetpart.partitioner.replan_deadline import replan_pipelines_within
    from hetpart.partitioner.replan_pipelines import OldPipeline, pipelines_from_json
    from hetpart.partitioner.shape_memo import ShapeMemo
    from hetpart.partitioner.solve import SolveOptions

    old = pipelines_from_json(json.loads((path / PIPELINES_RECORD).read_text()), str(path / PIPELINES_RECORD))
    holders = holders_of(manifest["ranks"])
    # NOTE [shape memo]: the partition's solved shapes, carried from event to event as `hetpart replan` carries
    # them from OLD_DIR to NEW_DIR (each search adds its own); --no-memo: every search from nothing, as before.
    memo_file = path / SHAPE_MEMO
    memo = None if args.no_memo or not memo_file.exists() else ShapeMemo.from_json(
        json.loads(memo_file.read_text()), str(memo_file))
    prior = [json.loads(x) for x in args.references.read_text().splitlines() if x.startswith("{")] if (
        args.references) else []
    m = plan_json["microbatches"]
    samples_per_step = plan_json["microbatch_size"] * m
    alive = {mc.name for mc in full.machines}
    events = trace(sorted(alive), args.events, args.preemptions_per_machine_day, args.return_hours, args.seed)
    rows, prev_t = [], 0.0
    iteration_ns = plan_json["iteration_us"] * 1000
    good = {"hetpart": 0.0, "restart": 0.0}
    for t, kind, machine in events:
        _train_until(good, rows, t - prev_t, iteration_ns * 1e-9, samples_per_step)
        (alive.discard if kind == "lose" else alive.add)(machine)
        start, cpu = time.perf_counter(), time.process_time()
        problem = retarget(stored, on_machines(full, alive))
        try:  # the reference and the re-splits within one deadline (NOTE [re-plan deadline]), as `hetpart replan`
            result, scratch_s = replan_pipelines_within(problem, old, holders, m, slack=args.slack,
                                                        time_limit_s=args.time_limit, seed=args.seed, memo=memo)
        except HetpartError as err:  # no plan at all on these devices: both policies stop until the next event
            rows.append(_no_plan_row(t, kind, machine, problem, time.perf_counter() - start,
                                     time.process_time() - cpu, str(err)))
            prev_t = t
            print(json.dumps(rows[-1]), flush=True)
            continue
        replan_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu
        scratch = result.scratch.plan if result.scratch is not None else None
        own = scratch  # the in-deadline from-scratch search's plan (NOTE [shape memo]: what the memo feeds)
        chosen, first = result.chosen, result.scratch or result.chosen  # no reference: the chosen plan stands in
        reference, restart_s, reshard = first.plan, scratch_s, None
        label = "+".join(str(len(p.plan.stages)) for p in scratch.pipelines) if scratch else "none"
        was = prior[len(rows)] if len(rows) < len(prior) else None  # --references: that run's reference
        if was is not None and was["event"] == f"{kind} {machine}" and was["restart_speed"] > 0:
            ref_ns = round(iteration_ns / was["restart_speed"])
            if scratch is None or ref_ns < reference.iteration_ns:
                reference = scratch = PriorReference(ref_ns, was["scratch_gap"])
                reshard, label = was["reshard_B"], was["scratch_stages"]
                restart_s = was["restart_down_s"] - transfer_ns(problem.network, reshard // max(1, len(alive))) * 1e-9
        elif args.reference_time_limit > 0:  # the user's from-scratch plan, made apart from the timed re-plan
            ref_start = time.perf_counter()
            try:
                ref, _ = plan_with_baselines(problem, m, SolveOptions(time_limit_s=args.reference_time_limit,
                                                                      seed=args.seed),
                                             baseline_limit_s=args.reference_time_limit / 2)
            except HetpartError:
                ref = None
            if ref is not None and (scratch is None or ref.iteration_ns < reference.iteration_ns):
                reference, scratch, restart_s = ref, ref, time.perf_counter() - ref_start
                label = "+".join(str(len(p.plan.stages)) for p in ref.pipelines)
        floor = lost_state_bytes(problem, holders)
        if reshard is None:
            reshard = sum(state_to_move_bytes(problem, w) for p in reference.pipelines
                          for ws in stage_weights(problem, p.plan.stage_of).values() for w in ws)
        reshard_ns = transfer_ns(problem.network, reshard // max(1, len(alive)))  # every machine reads its own
        reread = sum(state_to_move_bytes(problem, w) for p in chosen.plan.pipelines  # the chosen plan restarted
                     for ws in stage_weights(problem, p.plan.stage_of).values() for w in ws)
        mv = chosen.moves
        rows.append({
            "t_h": round(t / 3600, 2), "event": f"{kind} {machine}", "devices": len(problem.devices),
            "stages": "+".join(str(len(p.plan.stages)) for p in chosen.plan.pipelines),
            "scratch_stages": label,
            "replan_s": round(replan_s, 2), "cpu_s": round(cpu_s, 2), "scratch_solve_s": round(scratch_s, 2),
            "lexicographic_s": round(replan_s - scratch_s, 2), "move_s": round(mv.time_ns * 1e-9, 3),
            "left_out": result.left_out,  # NOTE [re-plan deadline]: candidates the deadline cut
            "moved_GiB": round((mv.between_bytes + mv.within_bytes + mv.checkpoint_bytes) / 2**30, 2),
            "between_GiB": round(mv.between_bytes / 2**30, 2),
            "network_GiB": round((mv.between_bytes + mv.checkpoint_bytes) / 2**30, 2),
            "scratch_moved_GiB": round(sum((first.moves.between_bytes, first.moves.within_bytes,
                                            first.moves.checkpoint_bytes)) / 2**30, 2),
            "reshard_GiB": round(reshard / 2**30, 2), "floor_GiB": round(floor / 2**30, 2),
            "moved_B": mv.between_bytes + mv.within_bytes + mv.checkpoint_bytes, "reshard_B": reshard,
            "reread_chosen_B": reread,
            "bottleneck_ratio": round(chosen.plan.iteration_ns / reference.iteration_ns, 4),
            "scratch_gap": round(reference.gap, 4) if scratch else 1.0,
            "status": chosen.name + ("" if scratch else " (the from-scratch search found none)"),
            "hetpart_down_s": replan_s + mv.time_ns * 1e-9, "restart_down_s": restart_s + reshard_ns * 1e-9,
            "hetpart_speed": iteration_ns / chosen.plan.iteration_ns,
            "restart_speed": iteration_ns / reference.iteration_ns,
            "memo_plans": memo.seeded if memo is not None else None,
            "own_search_ratio": round(own.iteration_ns / reference.iteration_ns, 4) if own else None,
        })
        holders = pipelines_holders(problem, chosen.plan)
        old = [OldPipeline(tuple(p.plan.slot_of_stage), p.plan.stage_of, tuple(p.plan.slot_of_stage), p.microbatches)
               for p in chosen.plan.pipelines]
        prev_t = t
        print(json.dumps(rows[-1]), flush=True)
    return _replayed(plan_json, rows, prev_t, good, prev_t / (iteration_ns * 1e-9) * samples_per_step)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument("--events", type=int, default=8)
    parser.add_argument("--preemptions-per-machine-day", type=float, default=1.0)
    parser.add_argument("--return-hours", type=float, default=2.0)
    parser.add_argument("--slack", type=float, default=0.02)
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reference-time-limit", type=float, default=30.0,
                        help="the from-scratch reference's own time limit, apart from the timed re-plan (0: the "
                             "re-plan's in-deadline reference)")
    parser.add_argument("--references", type=Path, default=None,
                        help="an earlier run's output (one DIR, the same trace): each event's reference taken from its "
                             "rows instead of solved again (before/after runs judged against the same references)")
    parser.add_argument("--no-memo", action="store_true",
                        help="re-plan without the partition's solved shapes (ir/shapes.json, NOTE [shape memo])")
    args = parser.parse_args()
    verdicts = []
    for path in args.dirs:
        out = replay(path, args)
        rows = out["rows"]
        moved = [r for r in rows if r["moved_GiB"] > 0]
        worst_s = max(r["replan_s"] for r in rows)
        fewer = min((r["reshard_GiB"] / r["moved_GiB"] for r in moved), default=float("inf"))
        total = sum(r["moved_B"] for r in rows)  # over the whole trace, every event's bytes
        overall = sum(r["reshard_B"] for r in rows) / total if total else float("inf")
        ratio = max(r["bottleneck_ratio"] for r in rows)
        net = min((r["reshard_GiB"] / r["network_GiB"] for r in moved if r["network_GiB"] > 0), default=float("inf"))
        over_floor = max((r["moved_GiB"] / r["floor_GiB"] for r in moved if r["floor_GiB"] > 0), default=1.0)
        print("| model | t (h) | event | devices | stages | solve s | re-plan s | total s (CPU s) | how | moved GiB "
              "(between, checkpoint) | floor GiB | re-shard GiB | re-shard / moved | "
              "bottleneck (pipelines: step) ratio | scratch gap | own search / reference | memo plans |")
        print("|" + "---|" * 17)
        for r in rows:
            times = "nothing moves" if r["moved_GiB"] == 0 else f"{r['reshard_GiB'] / r['moved_GiB']:.2f}x"
            print(f"| {out['model']} | {r['t_h']} | {r['event']} | {r['devices']} | {r['stages']} | "
                  f"{r['scratch_solve_s']} | {r['lexicographic_s']} | {r['replan_s']} ({r['cpu_s']}) | {r['status']} | "
                  f"{r['moved_GiB']} ({r['between_GiB']}, {r['network_GiB'] - r['between_GiB']:.2f}) | "
                  f"{r['floor_GiB']} | {r['reshard_GiB']} | {times} | {r['bottleneck_ratio']} | "
                  f"{r['scratch_gap']:.1%} | {r.get('own_search_ratio', '-')} | {r.get('memo_plans', '-')} |")
        print(f"{out['model']}: {len(rows)} events over {out['trace_h']} h; per event, from-scratch solve + re-plan: "
              f"max {worst_s} s (CPU max {max(r['cpu_s'] for r in rows)} s), median "
              f"{sorted(r['replan_s'] for r in rows)[len(rows) // 2]} s (the re-plan part: max "
              f"{max(r['lexicographic_s'] for r in rows)} s); re-sharding everything / bytes moved: min {fewer:.2f}x "
              f"over {len(moved)} events that move anything, {overall:.2f}x over the whole trace (bytes over the network only, between machines and "
              f"from the checkpoint: min {net:.2f}x); bytes moved / the lost state (the floor): max {over_floor:.2f}x; "
              f"worst bottleneck ratio (re-plan / from scratch) {ratio}; worst from-scratch gap "
              f"{max(r['scratch_gap'] for r in rows):.1%}; goodput hetpart / restart {out['goodput_ratio']}; goodput over "
              f"the first plan's unstopped {out['goodput_vs_first_plan']}")
        verdicts.append(f"{out['model']}: time <= 5 s {'MET' if worst_s <= 5 else 'NOT MET'} ({worst_s} s); "
                        f">= 3x fewer bytes at the worst event {'MET' if fewer >= 3 else 'NOT MET'} ({fewer:.2f}x), "
                        f"over the "
                        f"whole trace {'MET' if overall >= 3 else 'NOT MET'} ({overall:.2f}x); within 3% "
                        f"{'MET' if ratio <= 1.03 else 'NOT MET'} ({ratio}); goodput vs restart {out['goodput_ratio']}")
        if "reread_chosen_B" in rows[0]:  # pipelines: the chosen plan itself restarted from the checkpoint
            worst = min((r["reread_chosen_B"] / r["moved_B"] for r in rows if r["moved_B"]), default=float("inf"))
            print(f"{out['model']}: re-reading every stage of the chosen plan (a restart of the same plan) / bytes "
                  f"moved: min {worst:.2f}x at an event, {sum(r['reread_chosen_B'] for r in rows) / total:.2f}x over "
                  "the whole trace" if total else f"{out['model']}: nothing moved over the whole trace")
    for line in verdicts:
        print("verdict " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
