"""The search-free bounds per device *type* rather than per device, for large clusters: NOTE
[stage-sum bound by types], NOTE [sequence bound by types]; bounds.py runs them; and the
machines' type counts the stage-sum bound reads.

NOTE [stage-sum bound by types]
The stage-sum bound (bounds.py) takes the least, over every multiset n of device counts (n_t
devices of type t), of three bounds of that multiset; there are prod_t (count_t + 1) multisets
(2.2 billion on 1,024 GPUs of four types). Above STAGE_SUM_MAX_MULTISETS of them it runs here
instead, on the pairs (U, S): U the set of types a plan uses, S its stage count. Every multiset
has one such pair, and for each pair this takes, for each of the three, a value at most that
multiset's, so the least over the pairs is at most the least over the multisets: a weaker
bound, still valid, in 2^types x devices steps.
- The slowest node on its fastest type, and each node's time on its fastest type (W), depend on
  U only.
- Transfers: S - 1 boundaries, m - 1 of them over the network where m is the fewest machines
  holding the devices; comm(m) = (m - 1) net + (S - m) intra grows with m (intra <= net), so a
  lower bound on m gives a lower bound on comm: m >= ceil(S / the largest machine) and, when
  every machine holds one type, m >= |U|. The average (W + 2 comm) / S then uses that.
- NOTE [Lagrangian LP bound] of n is (P(U) + least(U) * 2 comm - sum_t mu_t cap_t(n_t)) /
  sum_t lam_t n_t, with cap_t(n_t) the n_t largest capacities of type t. Over the n of (U, S) its
  numerator is at least P + least * 2 comm_lo - (the most sum_t mu_t cap_t(n_t) can be: each type
  of U its largest device, then the S - |U| largest mu_t * capacity left, greedily, which is exact
  for sums of sorted prefixes), and its denominator at most the most sum_t lam_t n_t can be
  (likewise); a positive numerator over the largest denominator bounds every n's value, a
  numerator <= 0 gives 0.
- Memory: (U, S) is skipped when even its largest S devices (each type of U at least one) cannot
  hold the model, as a multiset is when its devices cannot.
tests/partitioner/test_bounds_deadline_scale.py checks it against the exact bound and brute force.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from hetpart.partitioner.costs import DeviceClass, device_classes
from hetpart.partitioner.lp_bounds import _floor_ns
from hetpart.partitioner.problem import Link, Problem

STAGE_SUM_MAX_MULTISETS = 20_000  # above this many device multisets, the stage-sum bound runs per (types, stages)
TYPES_MAX = 14  # 2^types subsets at most: above, no stage-sum bound by types


@dataclass(frozen=True)
class TypeFleet:
    """What NOTE [stage-sum bound by types] needs of the devices, per type (in the LP data's order)."""

    capacities_bytes: list[np.ndarray]  # per type: its devices' capacities, largest first (int64)
    max_stages: int
    machine_size: int  # devices on the largest machine
    pure_machines: bool  # every machine holds devices of one type


def _top_sum(first: np.ndarray, rest: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """For each k in `extra`: sum(first) + the k largest of `rest` (k clipped to len(rest); -inf beyond)."""
    prefix = np.concatenate([[0.0], np.cumsum(np.sort(rest)[::-1])])
    out = first.sum() + prefix[np.minimum(extra, len(rest))]
    return np.where(extra <= len(rest), out, -np.inf)


def stage_sum_by_types_ns(fleet: TypeFleet, time_us: np.ndarray, mem_mb: np.ndarray, allowed: np.ndarray,
                          lam: np.ndarray, mu: np.ndarray, need_bytes: int, net_ns: int, intra_ns: int,
                          deadline: float | None = None) -> int | None:
    """NOTE [stage-sum bound by types], rounded down; 0 when no (types, stages) can hold the model;
    None when `deadline` passed first or there are more than TYPES_MAX types."""
    nt = time_us.shape[1]
    if nt > TYPES_MAX:
        return None
    time_ns = np.rint(time_us * 1000).astype(np.int64)  # exact: times are integer ns
    big = np.int64(1) << np.int64(62)
    best: int | None = None
    for size in range(1, nt + 1):
        for U in itertools.combinations(range(nt), size):
            if deadline is not None and time.perf_counter() > deadline:
                return None
            used = np.zeros(nt, dtype=bool)
            used[list(U)] = True
            ok = allowed & used[None, :]
            if not ok.any(axis=1).all() or any(len(fleet.capacities_bytes[t]) == 0 for t in U):
                continue  # some node runs on none of these types, or a type has no device
            caps_b = [fleet.capacities_bytes[t] for t in U]
            caps = [c / 1e6 for c in caps_b]  # MB, the LP's unit
            most = min(fleet.max_stages, sum(len(c) for c in caps))
            S = np.arange(size, most + 1, dtype=np.int64)
            if len(S) == 0:
                continue
            extra = S - size
            # Memory: the largest S devices with each type of U at least once.
            firsts = np.array([c[0] for c in caps_b])
            rests = np.concatenate([c[1:] for c in caps_b])
            feasible = _top_sum(firsts, rests, extra) >= need_bytes
            if not feasible.any():
                continue
            S, extra = S[feasible], extra[feasible]
            fastest = np.where(ok, time_ns, big).min(axis=1)
            work, slowest = int(fastest.sum()), int(fastest.max())
            # The fewest machines, at least; transfers grow with them.
            machines = np.maximum(-(-S // fleet.machine_size), size if fleet.pure_machines else 1)
            comm = np.where(S == 1, 0, (machines - 1) * net_ns + (S - machines) * intra_ns)
            average = -(-(work + 2 * comm) // S)
            # NOTE [Lagrangian LP bound] with the least numerator over the largest denominator.
            lam_u, mu_u = np.where(used, lam, 0.0), np.where(used, mu, 0.0)
            lagrange = np.zeros(len(S), dtype=np.int64)
            if lam_u.any():
                per_node = np.where(ok, time_us * lam_u[None, :] + mem_mb[:, None] * mu_u[None, :], np.inf)
                least = float(lam_u[list(U)].min())
                memory = _top_sum(np.array([mu_u[t] * c[0] for t, c in zip(U, caps)]),
                                  np.concatenate([mu_u[t] * c[1:] for t, c in zip(U, caps)]), extra)
                counts = np.concatenate([np.full(len(c) - 1, lam_u[t]) for t, c in zip(U, caps)])
                denom = _top_sum(lam_u[list(U)], counts, extra)
                numer = float(per_node.min(axis=1).sum()) + least * 2 * comm / 1000 - memory
                value_us = np.where((numer > 0) & (denom > 0), numer / np.where(denom > 0, denom, 1.0), 0.0)
                lagrange = np.array([_floor_ns(float(v)) for v in value_us], dtype=np.int64)
            value = int(np.maximum(np.maximum(average, lagrange), slowest).min())
            best = value if best is None else min(best, value)
    return best or 0


def devices_per_machine(problem: Problem) -> dict[str, dict[str, int]]:
    """Machine -> device type -> how many of its devices are of that type."""
    have: dict[str, dict[str, int]] = {}
    for s in problem.slots:
        have.setdefault(s.node, {}).setdefault(s.type, 0)
        have[s.node][s.type] += 1
    return have


def fewest_machines(have: dict[str, dict[str, int]], want: dict[str, int]) -> int:
    """The fewest machines (of `devices_per_machine`) whose devices include `want[t]` devices of each type t."""
    machines = sorted(have)
    if len(machines) > 12:
        return 1
    for size in range(1, len(machines) + 1):
        for chosen in itertools.combinations(machines, size):
            if all(sum(have[m].get(t, 0) for m in chosen) >= k for t, k in want.items()):
                return size
    return len(machines)


# NOTE [sequence bound by types]
# On large clusters the (type, machine) classes of NOTE [sequence bound] have too many states
# (128 machines of 8: 9^128). The bound is then run on classes of one type, which relaxes it
# (every plan is still one of its sequences, so it stays a bound):
# - the link between two stages on types a and b is the best any two such devices may have: the
#   highest bandwidth and the lowest latency among the network (when a device of a and another of b
#   can sit on two machines) and the links of the machines that hold both (two devices of a, when
#   a = b); no link is slower for any number of bytes;
# - where even the types' device counts give more than `max_states` states, each type's count
#   saturates at a cap: a state at its cap stands for "cap or more", and the type may take any
#   number of stages more (caps as large as fit, the smallest types' counts kept exact first).
def type_classes(problem: Problem) -> tuple[list[DeviceClass], list[list[Link | None]]]:
    """The classes of one type, and the best link between a stage on one and the next (NOTE [sequence bound by types])."""
    classes = sorted(device_classes(problem, "type"), key=lambda c: c.type)
    where: dict[str, Counter] = {c.type: Counter(problem.slot(d).node for d in c.devices) for c in classes}
    out: list[list[Link | None]] = []
    for a in classes:
        row: list[Link | None] = []
        for b in classes:
            ma, mb = where[a.type], where[b.type]
            if a is b:
                shared = [m for m, k in ma.items() if k >= 2]
                apart = len(ma) >= 2
            else:
                shared = [m for m in ma if m in mb]
                apart = len(set(ma) | set(mb)) >= 2
            options = [problem.intra_node_links[m] for m in shared] + ([problem.network] if apart else [])
            row.append(Link(bandwidth_bytes_per_us=max(k.bandwidth_bytes_per_us for k in options),
                            latency_ns=min(k.latency_ns for k in options)) if options else None)
        out.append(row)
    return classes, out


def saturated_caps(sizes: list[int], max_states: int) -> list[int] | None:
    """Per class, the count a state tracks up to (NOTE [sequence bound by types]): the smallest
    classes their full size while the product of (cap + 1) stays within `max_states`, the others
    an even share of what is left; None when not even a cap of 1 each fits."""
    if 2 ** len(sizes) > max_states:
        return None
    caps = list(sizes)
    budget, left = max_states, len(sizes)
    for c in sorted(range(len(sizes)), key=lambda c: sizes[c]):
        even = int(round(budget ** (1 / left)))
        while even > 1 and (even) ** left > budget:
            even -= 1
        caps[c] = max(1, min(sizes[c], even - 1))
        budget, left = budget // (caps[c] + 1), left - 1
    return caps


def multisets(counts: list[int]) -> int:
    """How many multisets of devices the exact stage-sum bound visits."""
    return math.prod(c + 1 for c in counts)
