"""`solve_placement`: the strategy of `hetpart placement`, the DPs first, then CP-SAT, then the certificate check."""

from __future__ import annotations

import time

from hetpart.errors import HetpartError
from hetpart.partitioner.certificate import check_by_default, check_placement
from hetpart.placement.cpsat import solve_placement_cpsat
from hetpart.placement.hint import placement_hint
from hetpart.placement.ideals import IDEAL_SHARE, ideal_placement, placement_ideal_dp
from hetpart.placement.problem import Placement, PlacementProblem

def solve_placement(problem: PlacementProblem, *, time_limit_s: float = 60.0, workers: int = 1,
                    seed: int = 0, params: dict | None = None, gap: float = 0.0,
                    check_certificate: bool | None = None, ideal_dp: bool = True) -> Placement:
    """The placement with the least max load (NOTE [placement load]), or the best found in time.

    First the DP over ideals (NOTE [placement ideal DP]): when its placement is within `gap` of
    its bound, CP-SAT does not run. Otherwise CP-SAT over device slots 0..maxFPGAs+maxCPUs-1 in
    pipeline order, with the order encoding y[c][s] = [slot(class c) <= s] (the paper's
    contiguity assumption), a kind literal per slot, the better of the two DPs' placements as
    its hint and the ideal DP's bound as a cut. `check_certificate` (None:
    HETPART_CHECK_CERTIFICATE) re-proves an OPTIMAL claim by a route that uses neither,
    NOTE [checked certificates]. `ideal_dp=False` leaves the DP over ideals out (CP-SAT alone).
    """
    t0 = time.perf_counter()
    if not time_limit_s > 0:
        raise HetpartError(f"placement: --time-limit must be positive, got {time_limit_s}")
    if not 0 <= gap < 1:
        raise HetpartError(f"placement: --gap must be a fraction in [0, 1), e.g. --gap 0.01 for 1% (got {gap})")
    hint = placement_hint(problem)
    ideal = placement_ideal_dp(problem, deadline=t0 + IDEAL_SHARE * time_limit_s, known=hint) if ideal_dp else None
    if ideal is not None and ideal.devices is not None and ideal.settled(gap):
        result = ideal_placement(problem, ideal, t0)
    else:
        result = solve_placement_cpsat(problem, time_limit_s=max(0.1, time_limit_s - (time.perf_counter() - t0)),
                                        workers=workers, seed=seed, params=params, gap=gap, ideal=ideal)
        result.seconds = time.perf_counter() - t0
    if check_certificate if check_certificate is not None else check_by_default():
        t_check = time.perf_counter()
        result = check_placement(problem, result, time_limit_s=time_limit_s)
        result.stats["certificate_seconds"] = time.perf_counter() - t_check
        result.seconds += result.stats["certificate_seconds"]
    return result
