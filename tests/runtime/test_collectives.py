"""A TP rank's forward split into ops, skew and collectives (NOTE [collective skew] in hetpart/runtime/collectives.py),
on hand-built timelines whose skew is known. The real timelines' split: tests/runtime/test_tp_mixed_run.py."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from hetpart.runtime.collectives import match_collectives, rank_collectives
from hetpart.runtime.timeline import recording

US = 1000  # ns


def _coll(step: int, t0_us: float, t1_us: float, group=(0, 1), cpu_us: float = 10, nbytes: int = 4096,
          op: str = "all_reduce") -> dict:
    return {"kind": "collective", "op": op, "step": step, "t0_ns": round(t0_us * US), "t1_ns": round(t1_us * US),
            "cpu_ns": round(cpu_us * US), "bytes": nbytes, "group": list(group)}


def _forward(step: int, t0_us: float, t1_us: float, cpu_us: float) -> dict:
    return {"kind": "F", "step": step, "stage": 0, "mb": 0, "t0_ns": round(t0_us * US), "t1_ns": round(t1_us * US),
            "cpu_ns": round(cpu_us * US)}


def _two_ranks(step: int = 1) -> list[list[dict]]:
    """One forward per rank, 0-1000 us, with two all-reduces. Rank 0 enters the first at 200 us, rank 1 at 300 us
    (rank 0 waits 100 us for it); both leave at 350. Rank 0 enters the second at 700, rank 1 at 600 (rank 1 waits
    100 us); both leave at 800."""
    return [[_forward(step, 0, 1000, 700), _coll(step, 200, 350, cpu_us=20), _coll(step, 700, 800, cpu_us=30)],
            [_forward(step, 0, 1000, 650), _coll(step, 300, 350, cpu_us=5), _coll(step, 600, 800, cpu_us=40)]]


def test_the_k_th_call_of_a_group_is_matched_and_split_into_skew_and_the_call_itself():
    calls = sorted(match_collectives(_two_ranks()), key=lambda c: (c.index, c.rank))
    assert [(c.rank, c.index, c.skew_us, c.itself_us) for c in calls] == [
        (0, 0, 100, 50), (1, 0, 0, 50), (0, 1, 0, 100), (1, 1, 100, 100)]


def test_a_forward_is_its_ops_the_skew_and_the_collectives():
    by_rank = {r.rank: r for r in rank_collectives(_two_ranks())}
    zero, one = by_rank[0], by_rank[1]
    assert zero.collectives_per_forward == one.collectives_per_forward == 2
    assert (zero.forward_us, zero.skew_us, zero.itself_us) == (1000, 100, 150)
    assert zero.ops_wall_us == 1000 - 150 - 100 and zero.ops_cpu_us == 700 - 20 - 30
    assert (one.skew_us, one.itself_us, one.ops_wall_us, one.ops_cpu_us) == (100, 150, 750, 650 - 5 - 40)
    for r in (zero, one):  # the three parts make up the forward
        assert r.ops_wall_us + r.skew_us + r.itself_us == r.forward_us
    assert zero.itself_median_us == 75  # its calls: 50 and 100 us


def test_a_call_one_rank_did_not_record_is_left_out():
    ranks = _two_ranks()
    ranks[1].pop()  # rank 1's second all-reduce is missing (its timeline stopped there)
    calls = match_collectives(ranks)
    assert {(c.rank, c.index) for c in calls} == {(0, 0), (1, 0)}
    zero = {r.rank: r for r in rank_collectives(ranks)}[0]
    assert zero.collectives_per_forward == 1 and zero.skew_us == 100 and zero.ops_wall_us == 1000 - 150


def test_calls_the_ranks_disagree_on_are_left_out():
    ranks = _two_ranks()
    ranks[1][2]["bytes"] = 8192  # not the same call on both ranks: no skew can be read from it
    assert {c.index for c in match_collectives(ranks)} == {0}
    ranks[1][1]["group"] = [1, 2]  # another group: rank 0's first call has no partner left either
    assert match_collectives(ranks) == []


def test_the_first_step_is_left_out_and_a_rank_without_collectives_has_no_row():
    first = _two_ranks(step=0)
    assert rank_collectives(first) == [] and len(rank_collectives(first, skip_first=False)) == 2
    ranks = [_two_ranks()[0], _two_ranks()[1], [_forward(1, 0, 900, 900)]]  # rank 2: a TP-1 stage
    assert [r.rank for r in rank_collectives(ranks)] == [0, 1]


def test_the_timeline_puts_torch_distributed_s_collectives_back():
    before = dist.all_reduce, dist.all_gather
    with pytest.raises(RuntimeError, match="stop"), recording([]):
        assert (dist.all_reduce, dist.all_gather) != before  # recorded inside
        raise RuntimeError("stop")
    assert (dist.all_reduce, dist.all_gather) == before


def test_a_collective_after_the_schedule_stays_in_the_step_s_tail():
    # A gradient sync after the last action (kind "collective", recorded since tpmeasure) is not an action of the
    # schedule: the hand-off breakdown's tail still runs from the last action to the step's end.
    from hetpart.runtime.handoff import analyse

    def rank(sync: bool) -> list[dict]:
        events = [{"kind": "step", "step": 0, "t_ns": 0}, {**_forward(0, 100, 400, 300), "proc_cpu_ns": 0}]
        events += [_coll(0, 500, 900, group=(0,))] if sync else []
        return [*events, {"kind": "step_end", "step": 0, "t_ns": 1000 * US}]

    with_sync, without = (analyse([rank(s)], skip_first=False).ranks[0] for s in (True, False))
    assert with_sync.tail_us == without.tail_us == 600 and with_sync.head_us == 100
