"""The shapes of the outer program's answer solved again op by op in the time left (NOTE [op-level
refinement]). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from hetpart.errors import HetpartError
from hetpart.partitioner.pipeline_outer import Candidate, OuterAnswer, greedy_outer, solve_outer, sync_estimates
from hetpart.partitioner.problem import Plan

# NOTE [op-level refinement]
# Shapes are solved on the layer-level problem (NOTE [shapes on layers]) so that many fit in the
# search's share of the limit; a layer is coarse where a stage holds one or two of them (llama-7b's
# A100 stages hold half a layer: the 48-GPU shape takes 813 ms on layers, 780 ms op by op, and the
# 24-GPU one 714 against 704). When the outer program has answered and time is left before 0.9 of
# the time limit (the rest for the checks and the mixes of pieces after it), the whole-machine shapes
# its answer uses (the most pipelines first, at most _SHAPES) are solved again by `solve` on the ops
# (the device orders of NOTE [stash order], each within its share of what is left), each better
# plan added as one more candidate of its shape,
# and the outer program run again from the old answer; the answer with the lower true step
# (`cost_pipelines`) is kept by the caller. The bound does not change: it covers every plan.

_SHAPES = 2  # shapes of the answer solved again, at most
_LEAST_S = 2.0  # seconds a solve needs at least to be worth starting


def refine_answer(problem, kinds, cands: list[Candidate], answer: OuterAnswer, microbatches: int, kmax: int,
                  solve_ops: Callable[[tuple[str, ...], int, float], Plan | None], end: float, seed: int = 0,
                  workers: int = 1, unit_ns: int = 1) -> list[OuterAnswer]:
    """NOTE [op-level refinement]: new answers of the outer program over `cands` (extended in place with the
    op-level plans that beat their shape's), or [] when no time was left or nothing improved. `solve_ops(devices,
    m, limit_s)` is the op-level solve of one shape; everything stops by `end` (a perf_counter value)."""
    used = sorted((i for i, n in enumerate(answer.copies) if n and cands[i].piece_kind < 0),
                  key=lambda i: -answer.copies[i])[:_SHAPES]
    added = 0
    for k, i in enumerate(used):
        left = end - time.perf_counter()
        share = left / (len(used) - k) / 2  # half for the outer program's second run
        if share < _LEAST_S:
            break
        c = cands[i]
        plan = solve_ops(c.devices, c.m_ref, share)
        if plan is None:
            continue
        total = sum(s.time_ns for s in plan.stages)
        S = len(plan.stages)
        one_f1b = problem.training is not None and problem.training.schedule == "1f1b"
        lo = S if one_f1b else c.lo  # 1F1B: as many microbatches as stages
        if lo > c.hi or total + (c.m_ref - 1) * plan.bottleneck_ns >= c.sum_ns + (c.m_ref - 1) * c.bottleneck_ns:
            continue
        cands.append(dataclasses.replace(c, plan=plan, lo=lo, sum_ns=total, bottleneck_ns=plan.bottleneck_ns,
                                         sync_ns=[]))
        added += 1
    if not added:
        return []
    sync_estimates(problem, cands, kmax)
    out = [a for a in (greedy_outer(kinds, cands, microbatches, kmax),) if a is not None]
    hint = dataclasses.replace(answer, copies=answer.copies + [0] * added,
                               microbatches=answer.microbatches + [0] * added)
    try:
        got = solve_outer(kinds, cands, microbatches, kmax, max(0.5, end - time.perf_counter()), seed=seed,
                          workers=workers, unit_ns=unit_ns, hint=hint)
    except HetpartError:
        got = None
    return out + ([got] if got is not None else [])
