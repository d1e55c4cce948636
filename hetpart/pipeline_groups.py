"""`partition --pipelines` and `--pipeline-microbatches`: parsed and checked before torch, and the batch split.

Torch-free (stdlib and `hetpart.errors` only), so the CLI checks a mistyped device before it
imports torch (NOTE [arguments before torch] in cli.py).

    >>> parse_pipelines("local/0,local/1;local/2", ["local/0", "local/1", "local/2"])
    (('local/0', 'local/1'), ('local/2',))
    >>> split_microbatches(6, [200, 130])  # speeds 1/200 and 1/130: 2.36 and 3.64 microbatches
    [2, 4]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hetpart.errors import HetpartError, did_you_mean

PARALLEL_MODES = ("pipeline", "data")


def parse_pipelines(text: str, devices: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """`--pipelines "DEV,DEV;DEV,..."`: one device group per pipeline, each device of the cluster's `devices`
    in at most one group."""
    return check_groups(tuple(tuple(d.strip() for d in part.split(",")) for part in text.split(";")), devices, text)


def check_groups(groups: tuple[tuple[str, ...], ...], devices: Sequence[str],
                 text: str | None = None) -> tuple[tuple[str, ...], ...]:
    """`groups` (of `--pipelines`, given as `text`), each non-empty, of the cluster's `devices`, disjoint."""
    text = text if text is not None else ";".join(",".join(g) for g in groups)
    known = list(devices)
    seen: dict[str, int] = {}
    for p, group in enumerate(groups):
        if not group or any(not d for d in group):
            raise HetpartError(f"--pipelines {text!r}: pipeline {p} has an empty device name; give each pipeline's "
                               "devices separated by ',' and the pipelines by ';', e.g. "
                               f"--pipelines \"{','.join(known[:2])};{','.join(known[2:4]) or '...'}\"")
        for d in group:
            if d not in known:
                raise HetpartError(f"--pipelines: unknown device '{d}' in pipeline {p} (the cluster's devices: "
                                   f"{', '.join(known)}){did_you_mean(d, known)}")
            if d in seen:
                where = f"pipeline {p}" if seen[d] == p else f"pipelines {seen[d]} and {p}"
                raise HetpartError(f"--pipelines: device '{d}' is in {where}; each device runs in at most one "
                                   "pipeline, once")
            seen[d] = p
    return groups


def parse_pipeline_microbatches(text: str) -> tuple[int, ...]:
    """`--pipeline-microbatches 4,2`: each pipeline's share of the batch, in microbatches (each >= 1)."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise HetpartError(f"--pipeline-microbatches {text!r}: {part!r} is not a count >= 1; give one "
                               "integer per pipeline, e.g. --pipeline-microbatches 4,2")
        counts.append(int(part))
    return tuple(counts)


def check_pipeline_options(groups: Sequence[Sequence[str]] | None, counts: Sequence[int] | None, microbatches: int,
                           parallel: str) -> None:
    """How `--pipelines`, `--pipeline-microbatches`, `--parallel` and `--microbatches` fit together."""
    if parallel not in PARALLEL_MODES:
        raise HetpartError(f"--parallel {parallel}: expected {' or '.join(PARALLEL_MODES)}")
    if parallel == "data" and groups is not None:
        raise HetpartError("--parallel data searches the pipelines' device groups and --pipelines gives them: "
                           "pass one of the two")
    if counts is not None and groups is None:
        raise HetpartError("--pipeline-microbatches splits the batch over the pipelines of --pipelines; "
                           "pass --pipelines too (or leave the split out)")
    if groups is None:
        return
    if len(groups) > microbatches:
        raise HetpartError(f"--pipelines gives {len(groups)} pipelines but --microbatches is {microbatches}: "
                           "each pipeline needs at least one microbatch; pass more --microbatches")
    if counts is not None:
        if len(counts) != len(groups):
            raise HetpartError(f"--pipeline-microbatches gives {len(counts)} count(s) for {len(groups)} pipeline(s); "
                               "give one per pipeline")
        if sum(counts) != microbatches:
            raise HetpartError(f"--pipeline-microbatches {','.join(map(str, counts))} adds up to {sum(counts)}, "
                               f"but --microbatches is {microbatches}: the pipelines' shares make up the batch")


# NOTE [batch split]
# Without --pipeline-microbatches, pipeline p gets a share of the M microbatches in proportion
# to its speed, 1 / its bottleneck b_p (a pipeline runs one microbatch per bottleneck once it
# is full): the quota q_p = M (1/b_p) / sum(1/b). The integer shares are the largest-remainder
# rounding of q (Hamilton's method): each floor(q_p), then one more to the pipelines furthest
# below their quota (the largest remainders) until they add up to M, ties to the earlier
# pipeline. Every pipeline gets at least one microbatch (it has devices to use): a floor of 0
# is raised to 1 first, and where that overshoots M the pipelines furthest above their quota
# give one back. Each step moves the share that brings sum |share - quota| down the most, so
# the result is the integer split closest to the quotas (the sum is separable and convex;
# tests/test_pipelines_units.py checks it against every split by brute force). The bottlenecks
# are those of each group's plan at an equal share (`compile_pipelines`): the share changes a
# training plan's stash, rarely its bottleneck.
def split_microbatches(total: int, bottlenecks: Sequence[float]) -> list[int]:
    """NOTE [batch split]: `total` microbatches over pipelines of these bottlenecks (any unit), each >= 1."""
    if not bottlenecks or total < len(bottlenecks):
        raise HetpartError(f"{total} microbatch(es) cannot feed {len(bottlenecks)} pipeline(s): each needs one")
    speeds = [1.0 / b if b > 0 else math.inf for b in bottlenecks]
    if math.inf in speeds:  # a pipeline that costs nothing: the others get one each
        speeds = [1.0 if s == math.inf else 0.0 for s in speeds]
    quota = [total * s / sum(speeds) for s in speeds]
    shares = [max(1, math.floor(q)) for q in quota]
    pipelines = range(len(shares))
    while sum(shares) < total:  # one more to the pipeline furthest below its quota
        shares[max(pipelines, key=lambda p: (quota[p] - shares[p], -p))] += 1
    while sum(shares) > total:  # one back from the pipeline furthest above its quota
        shares[max((p for p in pipelines if shares[p] > 1), key=lambda p: (shares[p] - quota[p], -p))] -= 1
    return shares
