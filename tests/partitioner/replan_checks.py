"""The checks test_replan_tp.py and test_replan_mixed.py share: the bytes a TP re-plan moves against an independent
count (`read_count`: the resume's own read plan, NOTE [checkpoint slices]) and its choice against a brute force."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from partition_cases import valid_plans
from hetpart.partitioner import solve
from hetpart.partitioner.evaluate import bottleneck_ns
from hetpart.partitioner.replan import lexicographic_plan, moves, stage_weights
from hetpart.runtime.checkpoint_slices import plan_reads

Count = Callable[[object, dict, list], tuple[int, int, int]]


def read_count(problem, stage_of, slots, held: Callable[[str], list], need: Callable[[str, int, int], object],
               alive: Mapping[str, str]) -> tuple[int, int, int]:
    """(between, within, from the checkpoint): every new rank's layout of each weight its stage reads (`need(w, j,
    degree)`) assembled by `plan_reads` from the old ranks' (`held(w)`: (device, layout) of each old holder), each
    cell from the first in the runtime's order (own device, a surviving device of its machine, any surviving one, the
    checkpoint); bytes are elements x 4."""
    out = [0, 0, 0]
    for k, weights in stage_weights(problem, stage_of).items():
        devices = slots[k].split("+")
        for j, target in enumerate(devices):
            for w in sorted(weights):
                def rank(h):
                    d = h[0]
                    return (0 if d == target else 1 if d in alive and alive[d] == alive[target] else
                            2 if d in alive else 3)

                for read in plan_reads(w, need(w, j, len(devices)), sorted(held(w), key=rank)):
                    where = rank((read.file,))
                    if where:
                        out[{1: 1, 2: 0, 3: 2}[where]] += math.prod(s.stop - s.start for s in read.src) * 4
    return tuple(out)


def check_moves(problem, holdings, count: Count) -> None:
    """`moves` of the first 40 plans equal the independent count."""
    for stage_of, slots, _ in list(valid_plans(problem))[:40]:
        mv = moves(problem, stage_of, slots, holdings)
        assert (mv.between_bytes, mv.within_bytes, mv.checkpoint_bytes) == count(problem, stage_of, slots)


def check_lexicographic(problem, holdings, count: Count, slack: float) -> None:
    """The lexicographic choice is the fewest bytes (between, then within) of every plan within the slack."""
    plans = list(valid_plans(problem))
    best = min(bottleneck_ns(stages) for _, _, stages in plans)
    limit = math.floor(best * (1 + slack))
    want = min(count(problem, s, d)[:2] for s, d, stages in plans if bottleneck_ns(stages) <= limit)
    scratch = solve(problem, time_limit_s=10)
    assert scratch.bottleneck_ns == best
    got = lexicographic_plan(problem, scratch, holdings, slack=slack, time_limit_s=10)
    assert got.status == ["OPTIMAL", "OPTIMAL"]
    assert got.plan.bottleneck_ns <= limit
    assert (got.moves.between_bytes, got.moves.within_bytes) == want
    assert count(problem, got.plan.stage_of, got.plan.device_of_stage)[:2] == want


def check_large_candidates(problem, holdings, count: Count, old: list[str], monkeypatch) -> None:
    """NOTE [large re-plan]'s candidates (relabeling, the bytes DP) forced on a small problem: each plan they give is
    within the cap and moves no more than the from-scratch plan, by the independent count."""
    from hetpart.partitioner import replan

    scratch = solve(problem, time_limit_s=10)
    monkeypatch.setattr(replan, "RELABEL_ABOVE", 0)
    got = lexicographic_plan(problem, scratch, holdings, slack=0.5, old_devices=old)
    assert got.status[0] in replan.LARGE_STATUSES
    assert got.plan.bottleneck_ns <= got.limit_ns
    mine = count(problem, got.plan.stage_of, got.plan.device_of_stage)
    assert (got.moves.between_bytes, got.moves.within_bytes, got.moves.checkpoint_bytes) == mine
    assert mine[:2] <= count(problem, scratch.stage_of, scratch.device_of_stage)[:2]
