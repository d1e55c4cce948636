"""Plans with virtual stages: v*D stages on D devices, stage k on the device at position k mod D.

Interleaved schedules (NOTE [virtual-stage schedules] in simulate.py) need one device to hold
several non-adjacent stages. `plan_virtual` plans them with the machinery there is: the
problem's devices are copied into v "virtual devices" each (`virtual_problem`), and the exact
DP over a fixed device sequence (`dp.fixed_device_dp`) cuts the topological order into v*D
stages on the repeated sequence. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from hetpart.errors import HetpartError
from hetpart.partitioner.coarsen import cut_candidates
from hetpart.partitioner.dp import (
    COARSE_CUTS, EXACT_CUTS, contiguous_plan, fixed_device_dp, order_tables, refine_cuts, valid_cuts,
)
from hetpart.partitioner.problem import TIME_NS, Device, Plan, Problem
from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES

# NOTE [virtual stages plan]
# A device at position d of the sequence runs stages d, d+D, ..., d+(v-1)D. The problem is
# rewritten so that each is a stage of the ordinary kind: every device becomes v virtual devices
# `<name>#<i>` (same type and machine) and stage k runs on `<device k mod D>#<k div D>`; then the
# DP over that fixed sequence (exact over every valid cut of the topological order) minimises
# the slowest STAGE, each stage's time being NOTE [stage time]'s (its compute and both
# boundaries). Two consequences, said where the plan is printed:
# - Memory: a device's stages together must fit it. Each virtual device gets capacity // v, so
#   any plan found fits (the v stages sum to at most the capacity), but a plan whose stages fit
#   only unevenly is refused: a sufficient condition, not the exact one.
# - Objective: an interleaved step is about M times the busiest DEVICE's sum of its stages'
#   times, plus the bubble (simulate_ranks plays it). Minimising the slowest stage balances the
#   stages, hence the devices' sums on a homogeneous sequence, but is not that objective; so the
#   plan is "FEASIBLE", never "OPTIMAL", and its lower bound is one that holds for the stage
#   bottleneck of ANY plan with v*D stages on these devices: the largest node on its fastest type,
#   and the total work on the fastest type over v*D stages (`virtual_lower_bound_ns`; tests check
#   it against brute force).
SEPARATOR = "#"


@dataclass(frozen=True)
class VirtualPlan:
    """A plan over the virtual problem and how it maps back onto the real devices."""

    plan: Plan  # stage k on virtual device `plan.slot_of_stage[k]`
    problem: Problem  # the virtual problem (`virtual_problem`)
    devices: list[str]  # the real device sequence: rank r runs on devices[r]
    virtual_stages: int

    @property
    def device_of_stage(self) -> list[str]:
        """The real device of each stage: position k mod D."""
        return [self.devices[k % len(self.devices)] for k in range(len(self.plan.slot_of_stage))]

    def device_loads_ns(self) -> list[int]:
        """Each device's summed stage times (NOTE [virtual stages plan]): what an interleaved step's length follows."""
        loads = [0] * len(self.devices)
        for s in self.plan.stages:
            loads[s.index % len(self.devices)] += s.time_ns
        return loads

    def on_devices(self) -> Plan:
        """The plan with each stage on its real device (for plan.json, codegen and the report)."""
        real = self.device_of_stage
        stages = [dataclasses.replace(s, device=real[s.index], slot=real[s.index], devices=(real[s.index],))
                  for s in self.plan.stages]
        return dataclasses.replace(self.plan, slot_of_stage=real, stages=stages)

    def device_memory_bytes(self) -> list[int]:
        """Each device's memory: the sum of its stages'."""
        mem = [0] * len(self.devices)
        for s in self.plan.stages:
            mem[s.index % len(self.devices)] += s.memory_bytes
        return mem


def virtual_name(device: str, i: int) -> str:
    return f"{device}{SEPARATOR}{i}"


def virtual_problem(problem: Problem, devices: list[str], virtual_stages: int) -> Problem:
    """`problem` with each of `devices` copied into `virtual_stages` virtual devices of capacity // v."""
    copies = [Device(virtual_name(d.name, i), d.type, d.node, d.capacity_bytes // virtual_stages)
              for i in range(virtual_stages) for d in (problem.device(n) for n in devices)]
    training = problem.training
    if training is not None:
        training = dataclasses.replace(training, virtual_stages=virtual_stages)
    return dataclasses.replace(problem, devices=copies, max_stages=virtual_stages * len(devices), training=training)


def virtual_lower_bound_ns(problem: Problem, num_stages: int) -> int:
    """A lower bound on the slowest stage of any plan of `problem` with `num_stages` stages (NOTE [virtual stages
    plan]): every node runs somewhere at least as slowly as on its fastest allowed type, and some stage holds at
    least 1/num_stages of all that work."""
    g = problem.graph
    types = {d.type for d in problem.devices}
    fastest = [min(t for ty, t in g.nodes[v][TIME_NS].items() if ty in types) for v in g.nodes]
    return max(max(fastest, default=0), -(-sum(fastest) // max(1, num_stages)))


def plan_virtual(problem: Problem, virtual_stages: int, devices: list[str] | None = None) -> VirtualPlan:
    """The best contiguous plan of v*D stages on the repeated sequence `devices` (default: every device, in the
    problem's order); see NOTE [virtual stages plan]."""
    t0 = time.perf_counter()
    devices = [d.name for d in problem.devices] if devices is None else devices
    if virtual_stages < 2 or len(devices) < 2:
        raise HetpartError(f"--virtual-stages {virtual_stages} on {len(devices)} device(s): virtual stages need "
                           "--virtual-stages >= 2 and at least 2 devices")
    vp = virtual_problem(problem, devices, virtual_stages)
    num_stages = virtual_stages * len(devices)
    sequence = [virtual_name(devices[k % len(devices)], k // len(devices)) for k in range(num_stages)]
    tab = order_tables(vp)
    cuts = np.flatnonzero(valid_cuts(tab))
    if len(cuts) < num_stages - 1:
        raise HetpartError(f"--virtual-stages {virtual_stages}: the model has {len(cuts) + 1} places to cut at most, "
                           f"fewer than the {num_stages} stages of {virtual_stages} per device on {len(devices)} "
                           "devices: pass a smaller --virtual-stages")
    exact = len(cuts) <= EXACT_CUTS  # above, NOTE [candidate cuts]: candidates first, then windows around them
    if not exact:
        coarse = cut_candidates(tab, max(COARSE_CUTS, 4 * num_stages))
        cuts = coarse[valid_cuts(tab)[coarse]]
    windows = [np.array([0])] + [cuts] * (num_stages - 1) + [np.array([tab.n])]
    seg = fixed_device_dp(vp, tab, sequence, windows)
    if seg is not None and not exact:
        seg = refine_cuts(vp, tab, seg, radius=max(1, tab.n // (2 * len(cuts))))
    if seg is None:
        raise HetpartError(f"--virtual-stages {virtual_stages}: no plan of {num_stages} stages fits in memory when "
                           f"each device's {virtual_stages} stages get 1/{virtual_stages} of it each "
                           "(NOTE [virtual stages plan]): pass a smaller --virtual-stages, or more devices")
    plan = contiguous_plan(vp, tab, seg.cuts, seg.devices, t0, stats={})
    bound = virtual_lower_bound_ns(vp, num_stages)
    plan = dataclasses.replace(plan, lower_bound_ns=bound, solver_status="FEASIBLE",
                               solve_seconds=time.perf_counter() - t0)
    return VirtualPlan(plan=plan, problem=vp, devices=list(devices), virtual_stages=virtual_stages)


def check_virtual_options(schedule: str, virtual_stages: int | None, microbatches: int, several_pipelines: bool,
                          strategy: str) -> None:
    """`partition`'s --schedule and --virtual-stages, before anything is traced."""
    known = ("gpipe", "1f1b", *VIRTUAL_SCHEDULES)
    if schedule not in known:
        raise HetpartError(f"--schedule {schedule}: expected one of {', '.join(known)}")
    if schedule not in VIRTUAL_SCHEDULES:
        if virtual_stages is not None:
            raise HetpartError(f"--virtual-stages {virtual_stages} plans stages for an interleaved schedule: pass "
                               "--schedule interleaved-1f1b or interleaved-zb with it, or leave it out")
        return
    if virtual_stages is not None and virtual_stages < 2:
        raise HetpartError(f"--virtual-stages {virtual_stages}: an interleaved schedule runs 2 or more stages per "
                           "device; pass --virtual-stages 2 or more, or --schedule 1f1b")
    if several_pipelines:
        raise HetpartError(f"--schedule {schedule} plans one pipeline of virtual stages; leave out --pipelines and "
                           "--parallel data, or use --schedule gpipe or 1f1b with them")
    if strategy != "optimal":
        raise HetpartError(f"--strategy {strategy} writes a baseline's plan of one stage per device; leave it out with "
                           f"--schedule {schedule}")
