"""`--schedule auto` / `--microbatches auto`, torch-free (NOTE [schedule choice]): the choice against brute force
over every candidate solved as an explicit `--schedule S --microbatches M` is, memory that rules out the fastest
candidate, and the candidates' and options' rules."""

import random

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner import dp_hint, solve, verify_plan
from hetpart.partitioner.problem import Link
from hetpart.partitioner.baselines import simulated_timeline
from hetpart.partitioner.problem import FORWARD_NS, Device, Training
from hetpart.partitioner.schedule_choice import (
    AUTO_VIRTUAL_STAGES, TRAINING_SCHEDULES, Candidate, candidates, check_auto_options, choose_schedule,
    microbatch_counts, quick, schedule_problem,
)
from hetpart.partitioner.virtual import plan_virtual
from tests.partitioner.partition_cases import make_problem

BATCH = 8


def problem_maker(seed: int, capacity: int = 10**12, training: bool = True):
    """M -> a chain of 6 ops on 2 fast + 2 slow devices, each op's time a fixed overhead plus a share per sample
    of the microbatch (so fewer, larger microbatches pay less overhead but fill the pipeline later), its
    activations and outputs per sample, a weight each (training: a forward third of the time)."""
    rng = random.Random(seed)
    per_sample = [{"a": rng.randint(20, 200), "b": rng.randint(60, 600)} for _ in range(6)]
    overhead = {"a": rng.randint(50, 400), "b": rng.randint(50, 400)}

    def problem_for(m: int):
        mb = BATCH // m
        names = [f"op{i}" for i in range(6)]
        fwd = [{t: overhead[t] + c[t] * mb for t in c} for c in per_sample]
        nodes = {v: {"time": {t: 3 * f[t] if training else f[t] for t in f}, "mem": 4000 * mb, "out": 64 * mb,
                     "weights": (f"w{i}",)} for i, (v, f) in enumerate(zip(names, fwd))}
        devices = [Device("a0", "a", "m0", capacity), Device("a1", "a", "m0", capacity),
                   Device("b0", "b", "m1", capacity), Device("b1", "b", "m1", capacity)]
        p = make_problem(nodes, list(zip(names, names[1:])), devices, weights={f"w{i}": 10_000 for i in range(6)})
        if training:
            for v, f in zip(names, fwd):
                p.graph.nodes[v][FORWARD_NS] = dict(f)
            p.training = Training("gpipe", m, state_bytes={f"w{i}": 20_000 for i in range(6)})
        return p

    return problem_for


def solve_exactly(problem, seconds):
    plan = solve(problem, time_limit_s=max(seconds, 5.0))
    assert plan.solver_status == "OPTIMAL"
    return plan


def brute_force(problem_for, cands):
    """Each candidate planned as `partition --schedule S --microbatches M` plans it, and its simulated step."""
    steps = {}
    for c in cands:
        p = problem_for(c.microbatches)  # as lowering and compile_model set it for --schedule S --microbatches M
        if p.training is not None:
            p.training = Training(c.schedule, c.microbatches, p.training.state_bytes)
        if c.schedule == "1f1b" and c.microbatches < len(p.devices):
            p.max_stages = c.microbatches  # NOTE [1F1B stages]
        try:
            if c.virtual:
                v = plan_virtual(p, c.virtual_stages)
                steps[c] = simulated_timeline(v.problem, v.plan, c.microbatches, c.schedule, ranks=4).step_ns
            else:
                steps[c] = simulated_timeline(p, solve_exactly(p, 5), c.microbatches, c.schedule).step_ns
        except HetpartError:
            continue  # no plan fits this candidate
    return steps


def test_the_choice_is_the_best_of_every_candidate_solved_exactly():
    chosen_kinds = set()
    for seed in range(4):
        problem_for = problem_maker(seed)
        cands, _ = candidates(TRAINING_SCHEDULES, microbatch_counts(BATCH), AUTO_VIRTUAL_STAGES[:2], 4)
        choice = choose_schedule(problem_for, BATCH, cands, [], solve_exactly, 5.0)
        steps = brute_force(problem_for, cands)
        best = min(steps.values())
        assert choice.chosen.step_ns == best, (seed, choice.chosen.candidate, min(steps, key=steps.get))
        assert choice.chosen.candidate in [c for c, s in steps.items() if s == best]
        # each finalist's step is its exact plan's, and every candidate's the step of a plan that fits; a
        # candidate has no plan (V*D stages with fewer places to cut) exactly when its explicit run has none
        for e in choice.evaluated:
            assert e.fits == (e.candidate in steps), e
            assert not e.fits or e.memory_bytes <= e.capacity_bytes
            if e.plan_from == "solved":
                assert e.step_ns == steps[e.candidate]
        chosen_kinds.add((choice.chosen.candidate.schedule, choice.chosen.candidate.microbatches))
    assert len(chosen_kinds) > 1  # the cases do not all have one answer


def test_memory_that_rules_out_the_fastest_candidate_makes_the_choice_the_next():
    cands, _ = candidates(("gpipe", "1f1b"), microbatch_counts(BATCH), (2,), 4)
    roomy = choose_schedule(problem_maker(1), BATCH, cands, [], solve_exactly, 5.0)
    fastest = roomy.chosen
    # The most memory per device under which the fastest candidate has no plan at all.
    tight = fastest.memory_bytes
    while brute_force(problem_maker(1, capacity=tight), [fastest.candidate]):
        tight = tight * 19 // 20
    problem_for = problem_maker(1, capacity=tight)
    choice = choose_schedule(problem_for, BATCH, cands, [], solve_exactly, 5.0)
    steps = brute_force(problem_for, cands)
    assert fastest.candidate not in steps and not next(e for e in choice.evaluated
                                                       if e.candidate == fastest.candidate).fits
    assert choice.chosen.step_ns == min(steps.values()) > fastest.step_ns
    assert all(e.memory_bytes <= tight for e in choice.evaluated if e.fits)
    with pytest.raises(HetpartError, match="no schedule and microbatch count tried has a plan that fits"):
        choose_schedule(problem_maker(1, capacity=1000), BATCH, cands, [], solve_exactly, 5.0)


def test_a_finalist_whose_solve_fails_keeps_its_quick_plan():
    cands, _ = candidates(("gpipe", "1f1b"), microbatch_counts(BATCH), (2,), 4)

    def fails(problem, seconds):
        raise HetpartError("no plan found in time")

    choice = choose_schedule(problem_maker(3), BATCH, cands, [], fails, 5.0)
    assert choice.chosen.plan_from == "quick" and "the solve failed, its quick plan kept" in choice.chosen.note
    assert choice.chosen.step_ns == min(e.step_ns for e in choice.evaluated if e.fits)


def test_inference_chooses_only_the_microbatch_count():
    problem_for = problem_maker(2, training=False)
    cands, _ = candidates(("gpipe",), microbatch_counts(BATCH), (2,), 4)
    choice = choose_schedule(problem_for, BATCH, cands, [], solve_exactly, 5.0)
    assert {e.candidate.schedule for e in choice.evaluated} == {"gpipe"}
    assert choice.chosen.step_ns == min(brute_force(problem_for, cands).values())


def test_candidates_follow_what_run_accepts():
    assert microbatch_counts(7) == [1, 7] and microbatch_counts(12, 5) == [1, 2, 3, 4]
    found, left = candidates(TRAINING_SCHEDULES, [1, 2, 6], (2, 3), 4)
    assert Candidate("1f1b", 1) not in found and "1f1b M=1: 1F1B needs 2 or more microbatches" in left
    assert Candidate("interleaved-zb", 6, 3) in found  # 6 is a multiple of its one round (6 // 4 = 1)
    assert not [c for c in found if c.virtual and c.microbatches % max(1, c.microbatches // 4)]
    assert candidates(("interleaved-1f1b",), [9], (2,), 4)[1] == [
        "interleaved-1f1b M=9: not a multiple of its rounds max(1, M // 4)"]
    # 1F1B with fewer microbatches than devices is planned on at most M stages (NOTE [1F1B stages])
    p = schedule_problem(problem_maker(0)(2), Candidate("1f1b", 2))
    assert p.max_stages == 2 and p.training.schedule == "1f1b" and p.training.microbatches == 2


@pytest.mark.parametrize("args, message", [
    (dict(schedule="auto", mode="inference"), "--schedule auto chooses among training schedules"),
    (dict(schedule="1f1b", microbatches="auto", batch_size=7, max_microbatches=4), "divides into no count of 2"),
    (dict(microbatches=4, max_microbatches=4), "pass --microbatches auto with it"),
    (dict(schedule="auto", strategy="equal-layers"), "not combined with --strategy equal-layers"),
    (dict(microbatches="auto", several_pipelines=True), "not combined with --pipelines"),
    (dict(schedule="auto", tensor_parallel=True), "not combined with --tensor-parallel"),
    (dict(schedule="gpipe", microbatches="auto", virtual_stages=2), "--virtual-stages 2 plans stages"),
])
def test_bad_auto_options_are_one_clear_error(args, message):
    base = dict(schedule="gpipe", microbatches="auto", max_microbatches=None, batch_size=8, mode="training",
                virtual_stages=None, several_pipelines=False, strategy="optimal", tensor_parallel=False)
    with pytest.raises(HetpartError, match=message.replace("(", r"\(")):
        check_auto_options(**{**base, **args})


@pytest.mark.parametrize("capacity", [35, 25])
def test_quick_says_no_plan_fits_only_when_none_does(capacity):
    # 1F1B, M = 2: the DP counts the largest stash (2 microbatches) on every stage, so it misses the one-stage
    # plan on d1 (1 microbatch, 30 bytes); the candidate said "no plan of contiguous stages fits in memory".
    nodes = {v: {"time": {"g": 10}, "mem": 10} for v in "abc"}
    p = make_problem(nodes, [("a", "b"), ("b", "c")], [Device("d0", "g", "m0", 5), Device("d1", "g", "m0", capacity)],
                     intra=Link(1000, 0))
    p.training = Training("1f1b", 2, {})
    assert dp_hint(p) is None
    e = quick(p, Candidate("1f1b", 2), 4, 10.0)
    if capacity == 35:
        assert e.fits and e.plan.device_of_stage == ["d1"] and e.note == ""
        verify_plan(p, e.plan)
    else:  # 30 bytes fit on no device, and d0 holds no node: proven
        assert not e.fits and e.note.startswith("no plan fits in memory")
        with pytest.raises(HetpartError, match="no plan fits in memory"):
            solve(p, time_limit_s=10)


def test_no_schedule_with_a_plan_in_time_says_time_not_memory():
    # The capacity-35 problem above has a plan; with no time for any candidate the error must not blame memory.
    def problem_for(m):
        nodes = {v: {"time": {"g": 10}, "mem": 10} for v in "abc"}
        p = make_problem(nodes, [("a", "b"), ("b", "c")], [Device("d0", "g", "m0", 5), Device("d1", "g", "m0", 35)],
                         intra=Link(1000, 0))
        p.training = Training("1f1b", m, {})
        return p

    with pytest.raises(HetpartError, match=r"found a plan within --time-limit 1e-06 s .*: raise --time-limit$"):
        choose_schedule(problem_for, 4, [Candidate("1f1b", 2)], [], lambda p, s: solve(p, time_limit_s=s), 1e-6)
    got = choose_schedule(problem_for, 4, [Candidate("1f1b", 2)], [], lambda p, s: solve(p, time_limit_s=s), 5.0)
    assert got.chosen.plan.device_of_stage == ["d1"]
