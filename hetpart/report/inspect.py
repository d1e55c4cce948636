"""`hetpart inspect DIR`: one stage's source with its inputs and outputs, one IR dump, or JSON for tools.

Reads only the artifacts directory (plan.json, manifest.json, rank<k>/, ir/), and prints
only what matches its sha256 in manifest.json (NOTE [artifacts are code] in hetpart/trust.py);
every lookup that misses lists what exists.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hetpart.errors import REDO_PARTITION, HetpartError
from hetpart.plan_report import PlanReport, as_json
from hetpart.report.table import share_of_bottleneck, simulated_step, transfer_us

_DUMP = re.compile(r"^(\d+)-(.+)\.txt$")


def ir_dumps(out: Path, manifest: dict[str, Any]) -> list[tuple[int, str, Path]]:
    """(number, pass name, path) of every `ir/NN-<name>.txt` the manifest lists, in order: not what the folder holds
    (review22: `--json` listed a file put there by hand, and `--ir 4` of a listed dump that was deleted said "no
    such IR dump" instead of that it is missing)."""
    found = []
    for relative in sorted(manifest["files"]):
        folder, _, name = relative.partition("/")
        m = _DUMP.match(name) if folder == "ir" else None
        if m:
            found.append((int(m.group(1)), m.group(2), out / relative))
    return found


def ir_dump(out: Path, key: str, manifest: dict[str, Any]) -> str:
    """The dump named by number (`3`, `03`) or pass name (`op-cost`), checked against the manifest."""
    from hetpart.runtime.artifacts import read_listed

    dumps = ir_dumps(out, manifest)
    for number, name, path in dumps:
        if (key.isdigit() and int(key) == number) or key == name:
            return read_listed(out, manifest, path.relative_to(out).as_posix()).decode()
    known = ", ".join(f"{n:02d} {name}" for n, name, _ in dumps) or f"none: '{out / 'ir'}' has no dumps"
    raise HetpartError(f"--ir {key}: no such IR dump in '{out / 'ir'}' (dumps: {known})")


def _rank(manifest: dict[str, Any], stage: int, out: Path, tp_rank: int | None = None) -> dict[str, Any]:
    ranks = manifest["ranks"]
    if any("pipeline" in e for e in ranks):  # several pipelines (issue 19): stage numbers repeat, K is the rank
        if tp_rank is not None:
            raise HetpartError(f"--tp-rank {tp_rank}: in a plan of several pipelines --stage K names rank K, whichever "
                               "TP rank it is; leave --tp-rank out")
        if 0 <= stage < len(ranks):
            return ranks[stage]
        raise HetpartError(f"--stage {stage}: '{out}' has ranks 0..{len(ranks) - 1}; in a plan of several "
                           "pipelines --stage K names rank K (pipeline 0's stages, then pipeline 1's, ...)")
    group = [e for e in ranks if e["stage"] == stage]  # a tensor-parallel stage: its group's ranks
    if not group:
        known = ", ".join(map(str, sorted({e["stage"] for e in ranks})))  # a TP stage's ranks share one
        raise HetpartError(f"--stage {stage}: '{out}' has no stage {stage} (stages: {known})")
    if tp_rank is None:
        return group[0]  # its TP rank 0 (the header names the group's ranks)
    by_tp = {e.get("tp", {}).get("rank", 0): e for e in group}
    if tp_rank in by_tp:
        return by_tp[tp_rank]
    if len(group) == 1:
        raise HetpartError(f"--tp-rank {tp_rank}: stage {stage} of '{out}' runs on one device, not a tensor-parallel "
                           "group (its one rank is TP rank 0); leave --tp-rank out")
    raise HetpartError(f"--tp-rank {tp_rank}: stage {stage} of '{out}' runs on a tensor-parallel group of "
                       f"{len(group)} (TP ranks 0..{len(group) - 1}: ranks "
                       f"{', '.join(str(e['rank']) for e in group)}); pass one of 0..{len(group) - 1}")


def _values(title: str, values: list[dict[str, Any]]) -> list[str]:
    lines = [f"# {title}:"]
    lines += [f"#   {v['name']} : {v['dtype']}[{','.join(map(str, v['shape']))}]" for v in values]
    return lines


def stage_text(out: Path, manifest: dict[str, Any], plan: PlanReport, stage: int, tp_rank: int | None = None) -> str:
    """A stage's device, inputs and outputs (from manifest.json), then its `stage.py`; of a tensor-parallel stage, its
    TP rank `tp_rank` (default 0)."""
    entry = _rank(manifest, stage, out, tp_rank)
    several = "pipeline" in entry and plan.pipelines  # each pipeline's stages (a TP stage: one row for its ranks)
    cost = plan.pipelines[entry["pipeline"]].stages[entry["stage"]] if several else plan.stages[entry["stage"]]
    from hetpart.runtime.artifacts import check_file

    source = out / entry["dir"] / "stage.py"
    digest = entry["files"].get("stage.py")
    if digest is None:
        raise HetpartError(f"manifest.json lists no sha256 for {entry['dir']}/stage.py; {REDO_PARTITION}")
    text = check_file(out, f"{entry['dir']}/stage.py", digest, f"rank {entry['rank']}: ", read=True)
    where = (f"stage {entry['stage']} of pipeline {entry['pipeline']}" if "pipeline" in entry
             else f"stage {stage} of {len(plan.stages)}")
    if "tp" in entry:  # which rank of the group (NOTE [tensor-parallel pipelines mesh])
        where += f", TP rank {entry['tp']['rank']} of {entry['tp']['degree']}"
        if "pipeline" not in entry and entry["tp"].get("group") is None:  # degrees per machine: a stage at 1
            where += " (one device, no tensor-parallel group)"  # (every such stage has group None: not a group)
        elif "pipeline" not in entry:  # --stage K names the stage: say where its other TP ranks' files are
            group = [e["rank"] for e in manifest["ranks"] if e.get("tp", {}).get("group") == entry["tp"]["group"]]
            where += f" (the group's ranks: {', '.join(map(str, group))})"
    head = [f"# rank {entry['rank']}, {where}: planned on {cost.device} "
            f"({cost.device_type}), {cost.predicted_time_us} us per microbatch",
            f"# file: {source}"]
    head += _values("inputs", entry["inputs"]) + _values("outputs", entry["outputs"])
    head.append(f"# weights: {len(entry['weights'])}")
    return "\n".join(head) + "\n\n" + text.decode()


def inspect_json(out: Path, manifest: dict[str, Any], plan: PlanReport) -> dict[str, Any]:
    """plan.json's numbers with each stage's derived columns and boundary values, for tools."""
    ranks = manifest["ranks"]  # rank k runs plan.stages[k] (NOTE [plan.json fields])
    step = simulated_step(plan)
    stages = []
    for k, s in enumerate(plan.stages):
        entry = next((e for e in ranks if e["stage"] == s.index and e.get("pipeline") == s.pipeline  # a TP stage:
                      and e.get("tp", {}).get("rank", 0) == 0), ranks[k] if k < len(ranks) else {})  # its TP rank 0
        stages.append({**as_json(s), "transfer_us": round(transfer_us(s), 3),
                       "share_of_bottleneck": round(share_of_bottleneck(plan, s), 6),
                       "dir": entry.get("dir"), "inputs": entry.get("inputs", []),
                       "outputs": entry.get("outputs", [])})
    # Every field of plan.json (`mode`, `schedule`, `certificate`, `bounds`, `layers`, ...: review22 found `mode`
    # missing, so a tool could not tell a training plan's compute_us, forward plus backward, from a forward), then
    # the derived ones; `cluster` is its name (plan.json has its devices).
    return {
        "out": str(out),
        **as_json(plan),
        "cluster": plan.cluster.name,
        "simulated_step": None if plan.pipelines else {  # several pipelines: no one schedule (iteration_us)
            "schedule": step.schedule, "step_us": round(step.step_ns / 1000, 3),
            "bubble_fraction": round(step.bubble_fraction, 6)},
        "stages": stages,
        "ir": [{"number": n, "name": name, "file": str(p.relative_to(out))} for n, name, p in ir_dumps(out, manifest)],
    }


__all__ = ["inspect_json", "ir_dump", "ir_dumps", "stage_text"]
