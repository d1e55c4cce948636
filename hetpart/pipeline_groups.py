"""`partition --pipelines` and `--pipeline-microbatches`: parsed and checked before torch, and the batch split.

Torch-free (stdlib and `hetpart.errors` only), so the CLI checks a mistyped device before it
imports torch (NOTE [arguments before torch] in cli.py).

    >>> parse_pipelines("local/0,local/1;local/2", ["local/0", "local/1", "local/2"])
    (('local/0', 'local/1'), ('local/2',))
    >>> split_by_time(6, [lambda m: 200 * (m + 2), lambda m: 130 * m])  # 600 and 650 (2/4: 800 and 520)
    [1, 5]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
# Without --pipeline-microbatches, the M microbatches are split so that the slowest pipeline finishes
# first: each group is planned at an equal share, and t_p(m) is that plan's simulated time for m
# microbatches (GPipe or 1F1B: its fill and drain as well as its bottleneck, so a long pipeline of
# fast devices gets less than its speed alone would give it). Every pipeline gets one microbatch
# (it has devices to use), then each further microbatch goes to the pipeline whose time after taking
# it is least (ties to the earlier pipeline). Each t_p is nondecreasing in m, so this greedy split
# minimises max_p t_p(m_p): were some split's maximum T below the greedy's, the greedy would have
# stopped giving to each pipeline p at or before that split's m_p, short of M in all
# (tests/test_pipelines_units.py checks it against every split by brute force). Until issue 19's
# export3d review the split was in proportion to speed, 1 / bottleneck: for a 3-stage and a
# 1-stage pipeline of 4 microbatches it gave 3/1 where 2/2 is faster in the same cost model. The
# groups are then planned again at their shares (a training plan's stash follows its share), and
# `compile_pipelines` keeps the equal-share plans where they are faster still.
def split_by_time(total: int, times: Sequence[Callable[[int], float]]) -> list[int]:
    """NOTE [batch split]: `total` microbatches over pipelines whose time for m microbatches is `times[p](m)`
    (nondecreasing in m), each >= 1, the slowest pipeline's time least."""
    if not times or total < len(times):
        raise HetpartError(f"{total} microbatch(es) cannot feed {len(times)} pipeline(s): each needs one")
    shares = [1] * len(times)
    for _ in range(total - len(times)):
        p = min(range(len(times)), key=lambda q: (times[q](shares[q] + 1), q))
        shares[p] += 1
    return shares
