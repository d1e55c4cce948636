"""The device join of the pipelines search (NOTE [device join]): idle devices, a few at a time, given to the plan's
slowest pipelines. Nothing here imports torch."""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from dataclasses import dataclass

from hetpart.partitioner.pipeline_outer import renamed
from hetpart.partitioner.pipelines import Pipeline, PipelinesPlan, _devices_of, cost_pipelines, pipelines_violations
from hetpart.partitioner.problem import Plan, Problem

_DEVICES = (1, 2)  # devices of one kind given to each slowest pipeline per try

# NOTE [device join]
# NOTE [join probe] gives whole machines to the pipelines of the outer program's answer; a machine whose
# eight devices would add eight stages to a pipeline's fill may still pay for one, and a plan the stripe
# probe or a one-machine mix found is never joined at all. llama-70b on hetero-64: the plan is one pipeline
# of 48 GPUs at 64 microbatches (6,366 ms); the probe's 56-device join (a whole L4 machine) planned to
# 10,207 ms, so the 16 L4s were idle, while the same pipeline planned again with one L4 more takes 6,307 ms
# (docs/benchmarks.md, "idle19"). So after the search has its plan (stripes and mixes included), in what is
# left of the time limit, each kind of idle device (type and capacity) gives k devices (k = 1, 2) to each of
# the plan's slowest pipelines (those whose time is the plan's pipeline time) when it has devices enough:
# the first of them is planned again on its devices plus its k by the search's planner (in each device
# order, for its microbatches), and the others run that plan renamed onto their own devices plus theirs
# (`renamed`, recosted: stripes and copies of one shape list their devices alike; a slowest pipeline of other
# device kinds, tied with the first, is planned again on its own devices, as no renaming fits it). The plan, the other
# pipelines and every share of the batch unchanged, is costed by `cost_pipelines` (its sync included),
# checked by `pipelines_violations`, and kept when its step is lower; the tries go on from it. Each kind's
# last try is kept for NOTE [idle reasons] (its step, or that the planner ran no stage on the added devices;
# a stage of no work, an input placeholder alone, counts as none: it would print the device as used), but not
# over one against the same plan that made the pipeline faster (rev26: a planner short of time may do worse
# with two devices than with one, and the reason would call the kind too slow to help on that alone).
# Stats: device_join_tries, device_join_taken, device_join_seconds.


def _idle_by_kind(problem: Problem, plan: PipelinesPlan) -> dict[tuple[str, int], list[str]]:
    """The devices in no pipeline, per (type, capacity), taken one machine after another (m0/0, m1/0, m0/1, ...)."""
    held = {d for p in plan.pipelines for d in p.devices}
    per: dict[tuple[str, int], dict[str, list[str]]] = {}
    for d in problem.devices:
        if d.name not in held:
            per.setdefault((d.type, d.capacity_bytes), {}).setdefault(d.node, []).append(d.name)
    out = {}
    for kind, machines in per.items():
        rows = list(machines.values())
        out[kind] = [r[i] for i in range(max(map(len, rows))) for r in rows if i < len(r)]
    return out


def _record(tries: dict[tuple[str, int], DeviceTry], kind: tuple[str, int], t: DeviceTry) -> None:
    """Keep `t` as `kind`'s try, unless the kept one, against the same plan, made the slowest pipeline faster and `t`
    did not: NOTE [idle reasons] would call the kind too slow to help on the later try alone (rev26)."""
    was = tries.get(kind)
    if was is not None and was.against == t.against and _faster(was) and not _faster(t):
        return
    tries[kind] = t


def _faster(t: DeviceTry) -> bool:
    """Whether try `t` made its slowest pipeline faster."""
    return t.pipeline_ns is not None and t.pipeline_ns < t.was_ns


def _ran(plan: Plan | None) -> set[str]:
    """The devices `plan` runs work on: a stage of no work (an input placeholder alone) runs nothing on its device."""
    return set() if plan is None else {d for st in plan.stages if st.compute_ns > 0 for d in _devices_of(st)}


def _kinds(problem: Problem, devices: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """The (type, capacity) of each of `devices`, in order: a plan renamed onto devices of the same kinds is a plan."""
    return tuple((problem.device(d).type, problem.device(d).capacity_bytes) for d in devices)


def _solve_in_time(devs: tuple[str, ...], m: int, solve: Callable[[tuple[str, ...], int, float], Plan | None],
                   limit_s: Callable[[int], float], expect_s: Callable[[int], float], end: float,
                   stats: dict[str, float]) -> tuple[bool, Plan | None]:
    """(whether there was time to try, the plan) of `solve` on `devs` at `m` microbatches, given what is left until
    `end` (at most `limit_s`'s), not started where a shape of that size is expected to take longer."""
    left = end - time.perf_counter()
    if left <= 0 or expect_s(len(devs)) > left:
        return False, None
    got = solve(devs, m, min(left, limit_s(len(devs))))
    stats["device_join_tries"] += 1
    return True, got


def _own_plan(problem: Problem, devs: tuple[str, ...], m: int, added: list[str],
              solve: Callable[[tuple[str, ...], int, float], Plan | None], limit_s: Callable[[int], float],
              expect_s: Callable[[int], float], end: float, stats: dict[str, float]) -> types.SimpleNamespace | None:
    """A slowest pipeline whose devices are of other kinds than the first's planned again on `devs` (its own and
    its `added` ones), as the first was; None where time is short or the plan runs nothing on `added`."""
    _, got = _solve_in_time(devs, m, solve, limit_s, expect_s, end, stats)
    return types.SimpleNamespace(devices=devs, plan=got) if _ran(got) & set(added) else None


@dataclass(frozen=True)
class DeviceTry:
    """One try of NOTE [device join]: `per` devices of a kind given to the slowest pipeline of the plan `against` (its
    pipelines' devices), planned again: that pipeline's time before (`was_ns`) and after (`pipeline_ns`, None where
    its planner ran no stage on them, or found no plan: `found`), and the step with every slowest pipeline so
    joined (None: too few devices)."""

    per: int
    was_ns: int
    pipeline_ns: int | None
    step_ns: int | None
    against: tuple[tuple[str, ...], ...]
    found: bool = True  # False: its planner returned no plan in the time it had (pipeline_ns None): nothing shown


def device_join(problem: Problem, plan: PipelinesPlan, microbatches: int,
                solve: Callable[[tuple[str, ...], int, float], Plan | None], limit_s: Callable[[int], float],
                expect_s: Callable[[int], float], end: float
                ) -> tuple[PipelinesPlan, dict[str, float], dict[tuple[str, int], DeviceTry]]:
    """NOTE [device join] from `plan` until `end` (a perf_counter value): `solve(devices, microbatches, seconds)`
    is the search's planner, `limit_s(n)` its seconds for a shape of n devices and `expect_s(n)` what one is
    expected to take; the plan kept, the stats, and each kind's (type, capacity) last try."""
    t0 = time.perf_counter()
    stats = {"device_join_tries": 0.0, "device_join_taken": 0.0}
    tries: dict[tuple[str, int], DeviceTry] = {}
    best = plan
    for k in _DEVICES:
        for kind, idle in _idle_by_kind(problem, best).items():
            top = max(p.time_ns for p in best.pipelines)
            slow = [i for i, p in enumerate(best.pipelines) if p.time_ns == top]
            first = best.pipelines[slow[0]]
            devs = tuple(first.devices) + tuple(idle[:k])
            if len(idle) < k:
                continue
            tried, got = _solve_in_time(devs, first.microbatches, solve, limit_s, expect_s, end, stats)
            if not tried:
                continue
            against = tuple(tuple(p.devices) for p in best.pipelines)
            ran = _ran(got)
            if got is None or not ran & set(idle[:k]):
                _record(tries, kind, DeviceTry(k, first.time_ns, None, None, against, found=got is not None))
                continue
            ref = types.SimpleNamespace(devices=devs, plan=got)
            joined = renamed(problem, ref, devs, first.microbatches, first.index)  # type: ignore[arg-type]
            if len(idle) < k * len(slow):  # not every slowest pipeline can have k: the step cannot drop
                _record(tries, kind, DeviceTry(k, first.time_ns, joined.time_ns, None, against))
                continue
            pipes: list[Pipeline] = list(best.pipelines)
            refs = {_kinds(problem, devs): ref}
            for n, i in enumerate(slow):
                p = best.pipelines[i]
                own = tuple(p.devices) + tuple(idle[n * k:(n + 1) * k])
                shape = _kinds(problem, own)
                if shape not in refs:  # other kinds than the first's: planned on its own devices
                    refs[shape] = _own_plan(problem, own, p.microbatches, idle[n * k:(n + 1) * k], solve, limit_s,
                                            expect_s, end, stats)
                if refs[shape] is None:
                    break
                pipes[i] = renamed(problem, refs[shape], own, p.microbatches, p.index)  # type: ignore[arg-type]
            if any(refs[s] is None for s in refs):  # a slowest pipeline left as it was: the step cannot drop
                _record(tries, kind, DeviceTry(k, first.time_ns, joined.time_ns, None, against))
                continue
            trial = cost_pipelines(problem, pipes, solver_status="FEASIBLE")
            valid = not pipelines_violations(problem, trial, microbatches)
            _record(tries, kind, DeviceTry(k, first.time_ns, joined.time_ns, trial.iteration_ns if valid else None,
                                           against))
            if valid and trial.iteration_ns < best.iteration_ns:
                best = trial
                stats["device_join_taken"] += 1
    stats["device_join_seconds"] = time.perf_counter() - t0
    return best, stats, tries
