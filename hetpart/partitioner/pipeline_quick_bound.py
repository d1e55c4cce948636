"""A search-free bound on the step of every plan of data-parallel pipelines, in milliseconds (NOTE [quick pipelines
bound]): what `choose_pipelines_degree` charges a degree whose NOTE [pipelines bound] did not finish in time.
Nothing here imports torch.
"""

from __future__ import annotations

import time

import numpy as np

from hetpart.partitioner.pipeline_bound_parts import whole_ns_at_least
from hetpart.partitioner.pipeline_bounds import PipelinesBound, _node_classes, need_bytes
from hetpart.partitioner.problem import Problem

# NOTE [quick pipelines bound]
# NOTE [pipelines bound]'s (a), (b), (c) and (e) with one support, every device type, and no LP: for the
# cost of a pass over the nodes (milliseconds on 5,806 nodes, where the LP bound takes seconds). Take any
# plan: k pipelines, pipeline i running m_i >= 1 microbatches on n_i devices, step T >= T_i = sum_i +
# (m_i - 1) b_i. With F the fill of every node on its fastest type (F <= F_A for every support A), L the
# slowest node on its fastest type, and lambda_t > 0 per type (each type's inverse total time: any
# positive lambda is valid), Lambda = sum_v min_t lambda_t time[v, t]:
# (a) T >= sum_i >= F, and T >= L (some stage runs the slowest node);
# (b) a stage on a device of type t runs m_i microbatches within T_i (sum_i and b_i hold its time), so
#     summing lambda_t x its work over every device, M Lambda <= T lambda . N (N the devices per type);
# (c) b_i lambda . n_i >= Lambda as in NOTE [pipelines bound] (b), so m_i - 1 <= (T - F) lambda . n_i /
#     Lambda, and summed over the pipelines M - k <= (T - F) lambda . N / Lambda;
# (e) m_i - 1 <= (T - F) / L, so M - k <= k (T - F) / L.
# k is at most M, the devices, and the pipelines the memory holds (each holds the model, (f):
# k need <= every device's memory), so (c) and (e) hold with that k_max (both weaken as k grows). Left
# out, against NOTE [pipelines bound]: supports (a slow pipeline's fill), memory beyond k_max, the sync.


def quick_pipelines_bound(problem: Problem, microbatches: int) -> PipelinesBound:
    """NOTE [quick pipelines bound] for `microbatches` microbatches (bound 0 when no device type runs some node)."""
    t0 = time.perf_counter()
    types, time_ns, allowed, count = _node_classes(problem)
    per_type = np.array([sum(1 for d in problem.devices if d.type == t) for t in types], dtype=np.float64)
    timed = np.where(allowed & (per_type > 0)[None, :], time_ns, np.inf)
    fastest = timed.min(axis=1) if len(count) else np.zeros(0)
    if not np.isfinite(fastest).all():
        return PipelinesBound(0, 0, "no device type of the problem runs every node: no plan, no bound", 0.0)
    fill, largest = float((fastest * count).sum()), float(fastest.max(initial=0.0))
    totals = np.where(np.isfinite(timed), timed, 0.0).T @ count  # each type's time for every node it runs
    lam = np.where(totals > 0, 1.0 / np.maximum(totals, 1e-300), 0.0)
    work = float(((timed * lam[None, :]).min(axis=1) * count).sum())  # Lambda
    rate = float(lam @ per_type)  # lambda . N
    capacity = sum(d.capacity_bytes for d in problem.devices)
    need = need_bytes(problem)
    k_max = min(microbatches, len(problem.devices), capacity // need if need > 0 else microbatches)
    if k_max < 1:
        return PipelinesBound(0, 0, "no set of pipelines holds the model in memory: no plan, no bound",
                              time.perf_counter() - t0)
    m = microbatches
    per_mb = work / rate if rate > 0 else 0.0
    bound = max(fill, largest, m * per_mb, fill + (m - k_max) * per_mb, fill + (m - k_max) * largest / k_max)
    one = max(fill + (m - 1) * max(per_mb, largest), m * per_mb)  # k = 1
    note = (f"every partition of the {len(problem.devices)} devices into pipelines (NOTE [quick pipelines bound]: "
            f"the fill, the work and the largest node over every device type, at most {k_max} pipeline(s)); left out: "
            "the supports' fills, memory per stage, the gradient sync, transfers between stages")
    # Float sums: as whole ns, less their float error, as the LP bound's (`whole_ns_at_least`).
    return PipelinesBound(whole_ns_at_least(bound), whole_ns_at_least(one), note, time.perf_counter() - t0)


__all__ = ["quick_pipelines_bound"]
