"""The schedule simulator against closed forms and schedule invariants (no torch)."""

import random

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner.simulate import simulate


@pytest.mark.parametrize("stages, m", [(1, 1), (1, 5), (3, 1), (4, 4), (4, 8), (6, 2)])
def test_gpipe_forward_equal_stages_no_comm(stages, m):
    t = simulate([7] * stages, [0] * (stages - 1), m)
    assert t.step_ns == (m + stages - 1) * 7
    assert len([e for e in t.events if e.kind == "fwd"]) == stages * m


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages, m", [(1, 3), (2, 2), (4, 4), (4, 8), (5, 3)])
def test_training_equal_stages_no_comm(schedule, stages, m):
    # Both schedules take (M + S - 1) * (f + b) on equal stages; 1F1B only saves memory.
    t = simulate([3] * stages, [0] * (stages - 1), m, schedule, backward_ns=[5] * stages)
    assert t.step_ns == (m + stages - 1) * (3 + 5)


def test_one_microbatch_is_the_sum_of_everything():
    t = simulate([10, 20, 30], [4, 6], 1)
    assert t.step_ns == 10 + 4 + 20 + 6 + 30
    sends = [(e.stage, e.peer, e.start_ns, e.end_ns) for e in t.events if e.kind == "send"]
    assert sends == [(0, 1, 10, 14), (1, 2, 34, 40)]


def test_transfer_occupies_both_stages_so_steady_state_is_the_stage_time():
    # NOTE [stage time]: stage 1 takes 4 + 20 + 6 = 30 per microbatch, the bottleneck (stage 0: 14, stage 2: 11).
    compute, transfer = [10, 20, 5], [4, 6]
    stage_time = [10 + 4, 4 + 20 + 6, 6 + 5]
    steps = [simulate(compute, transfer, m).step_ns for m in range(1, 12)]
    increments = {b - a for a, b in zip(steps[3:], steps[4:])}
    assert increments == {max(stage_time)}


def test_gpipe_training_runs_all_forwards_before_any_backward():
    t = simulate([2, 2, 2], [1, 1], 4, "gpipe", backward_ns=[3, 3, 3])
    for k in range(3):
        kinds = [e.kind for e in t.events if e.stage == k and e.kind != "send"]
        assert kinds == ["fwd"] * 4 + ["bwd"] * 4


def _in_flight_max(t, stage):
    live = peak = 0
    for e in sorted((e for e in t.events if e.stage == stage and e.kind != "send"), key=lambda e: e.start_ns):
        live += 1 if e.kind == "fwd" else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_schedules_respect_dependencies_and_never_overlap_on_a_stage(schedule):
    rng = random.Random(0)
    for stages in range(1, 7):
        for m in range(1, 9):
            fwd = [rng.randint(1, 20) for _ in range(stages)]
            bwd = [rng.randint(1, 40) for _ in range(stages)]
            comm = [rng.randint(0, 10) for _ in range(stages - 1)]
            t = simulate(fwd, comm, m, schedule, backward_ns=bwd)
            end = {(e.kind, e.stage, e.microbatch): e.end_ns for e in t.events if e.kind != "send"}
            start = {(e.kind, e.stage, e.microbatch): e.start_ns for e in t.events if e.kind != "send"}
            assert len(end) == 2 * stages * m
            for k in range(stages):
                busy = sorted((e.start_ns, e.end_ns) for e in t.events if k in (e.stage, e.peer))
                assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(busy, busy[1:]))
                for i in range(m):
                    if k > 0:
                        assert start["fwd", k, i] >= end["fwd", k - 1, i] + comm[k - 1]
                    if k < stages - 1:
                        assert start["bwd", k, i] >= end["bwd", k + 1, i] + comm[k]
                    assert start["bwd", k, i] >= end["fwd", k, i]
                # 1F1B keeps at most S - k microbatches in flight on stage k; GPipe keeps all M.
                expected = min(stages - k, m) if schedule == "1f1b" else m
                assert _in_flight_max(t, k) == expected
            assert t.step_ns == max(end.values())
            assert 0.0 <= t.bubble_fraction < 1.0


def test_bad_inputs_are_hetpart_errors():
    with pytest.raises(HetpartError, match="transfer_ns has 1 entries, expected 2"):
        simulate([1, 2, 3], [0], 2)
    with pytest.raises(HetpartError, match="unknown schedule 'zb'"):
        simulate([1], [], 2, "zb")
    with pytest.raises(HetpartError, match="microbatches must be >= 1"):
        simulate([1], [], 0)
    with pytest.raises(HetpartError, match="non-negative"):
        simulate([1, -2], [0], 1)
