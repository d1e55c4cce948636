"""plan.json as data: the `PlanReport` dataclass tree, written once by `partition`, read by one loader.

    compile_model --builds--> PlanReport --to_json--> plan.json --load_plan--> PlanReport --> report/, runtime/

This module imports only the standard library and `hetpart.errors`, so the writer (codegen,
`compile.py`) and the readers (`run`'s workers, `inspect`, the report) share it without
pulling in torch or each other. A field's JSON key is its name; its JSON type is in the
field's metadata, and `load_plan` checks every field against it, so a reader never checks
a key itself (NOTE [plan.json fields]).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from types import NoneType
from typing import Any

from hetpart.errors import REDO_PARTITION, HetpartError

FORMAT_VERSION = 1  # the layout only grew (stages' `slot`, `devices`): readers of version 1 read it as before
REDO = REDO_PARTITION
NUMBER = (int, float)
# The words `mode` and `schedule` may hold (NOTE [plan.json fields]): the schedules are partitioner/problem.py's
# SCHEDULES, named again here because this module imports nothing above it (tests/test_plan_report.py keeps the two
# equal, as tests/export/test_fast_cli.py does names.py's ZOO_NAMES).
PLAN_MODES = ("inference", "training")
PLAN_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb")


def _f(kind: Any, default: Any = dataclasses.MISSING, *, omit_none: bool = False, items: type | None = None,
       factory: Any = dataclasses.MISSING, words: tuple[str, ...] | None = None) -> Any:
    """A field of JSON type `kind` (a type or tuple of types); `items`: the dataclass of a list's entries or of
    an object; `omit_none`: left out of the JSON when None; `words`: the strings it may hold. A field without a
    default is required."""
    return field(default=default, default_factory=factory,
                 metadata={"kind": kind, "items": items, "omit_none": omit_none, "words": words})


# NOTE [plan.json fields]
# plan.json is deterministic (no timings: those are timings.json) and is edited by hand at
# times, so every reader goes through `load_plan`, which checks each field's JSON type
# before any code looks at it: a required field missing or of another type is an error
# naming the field; an optional one missing takes its default (a plan of an earlier
# version reads as it did). Booleans are never numbers. Tables that other modules own and
# serialize (`certificate`, `bounds`, `baselines`, `dynamic`, `outputs`) stay JSON objects
# here, checked to be objects or lists; their readers read them by key. A field of a few words
# (`mode`, `schedule`) holding another is an error naming it too: an edited `schedule` was
# "simulate: unknown schedule 'zz'" from `inspect`, naming no file, and an edited `mode` read as
# inference (review22).
# `slot` is what a stage runs on and `devices` the devices of that slot: today a slot is one
# device, named as it (issue 16); `device` stays the slot's first device for older readers.
# A plan of several data-parallel pipelines (issue 19, NOTE [pipelines plan]) adds `pipelines`,
# each with its share of the batch and its own stages (`index` counts within the pipeline,
# `pipeline` names it, `layers` its plan rounded to whole modules for `hetpart export`, as the
# top-level `layers` of a one-pipeline plan, which a plan of several leaves null), and the step's
# numbers: `iteration_us`, `grad_sync_us` (not overlapped) and `grad_sync_overlapped_us`, `devices_used`, `devices_idle` (device -> why no stage runs on
# it, with its numbers: NOTE [idle reasons]), `bound_note` (what `lower_bound_us` covers and what it
# leaves out: parts of the bound cut by the time limit, shapes left untried), and `search_stats` when
# `--parallel data` searched.
# Its top-level `stages` are every pipeline's in rank order (pipeline 0's, then 1's, ...), the
# records of `pipelines` again, so a reader that goes by rank (`run --measure`, `--emulate`)
# needs nothing else; `microbatches` is the global batch's, `bottleneck_us` the slowest
# pipeline's, and `lower_bound_us` and `gap` are of the iteration time. A plan of one pipeline
# leaves all of these out and reads exactly as before.


def bound_record_errors(plan: dict) -> list[str]:
    """Where plan.json's bound fields disagree (NOTE [bound over a union] in partitioner/tp_choice.py): the taken
    problem's bound is `lower_bound_us` and the least of `bound_problems`, and `bounds` and `certificate` name it."""
    problems = plan.get("bound_problems")
    if not problems:
        return []
    errors = []
    taken = [p for p in problems if p.get("taken")]
    if len(taken) != 1:
        return [f"bound_problems: {len(taken)} taken, expected 1"]
    least = min(p["lower_bound_us"] for p in problems if p["lower_bound_us"] is not None)
    for what, value in (("the taken problem's bound", taken[0]["lower_bound_us"]), ("the least bound", least),
                        ("bounds.lower_bound_us", (plan.get("bounds") or {}).get("lower_bound_us"))):
        if value is None or abs(value - plan["lower_bound_us"]) > 1e-3:
            errors.append(f"lower_bound_us {plan['lower_bound_us']} is not {what} ({value})")
    for name in ("bounds", "certificate"):
        own = taken[0].get(name)
        if plan.get(name) != (None if own is None else {**own, "problem": taken[0]["problem"]}):
            errors.append(f"{name} is not the taken problem's ({taken[0]['problem']})")
    return errors


@dataclass(frozen=True, kw_only=True)
class ModelRecord:
    """The model spec the plan was traced from (frontend.ModelSpec.to_json), and a file model's sha256."""
    model: str = _f(str)
    overrides: dict = _f(dict)
    batch_size: int = _f(int)
    seq_len: int = _f(int)
    seed: int = _f(int)
    file_sha256: str | None = _f((str, NoneType), None, omit_none=True)  # NOTE [model files]


@dataclass(frozen=True, kw_only=True)
class ClusterDevice:
    name: str = _f(str)
    type: str = _f(str)
    machine: str = _f(str)
    mem_bytes: int = _f(int)
    core: int | None = _f((int, NoneType), None, omit_none=True)  # NOTE [emulated devices] in runtime/emulate.py


@dataclass(frozen=True, kw_only=True)
class ClusterRecord:
    name: str = _f(str)
    devices: list[ClusterDevice] = _f(list, items=ClusterDevice)
    memory_reserve_bytes: int | None = _f((int, NoneType), None, omit_none=True)  # NOTE [memory reserve]


@dataclass(frozen=True, kw_only=True)
class StageReport:
    """One pipeline stage: where it runs and what it costs per microbatch (times in us, rounded to ns)."""
    index: int = _f(int)
    device: str = _f(str)
    device_type: str = _f(str)
    machine: str = _f(str, "")
    slot: str | None = _f((str, NoneType), None)  # None in plans before slots: `device`
    devices: list[str] = _f(list, factory=list)  # the slot's devices; empty in plans before slots: [device]
    node_count: int = _f(int)
    flops: float = _f(NUMBER)
    param_bytes: int = _f(int, 0)
    predicted_time_us: float = _f(NUMBER)
    compute_us: float = _f(NUMBER)  # training: forward + backward (NOTE [training costs] in passes/lower.py)
    comm_in_us: float = _f(NUMBER)
    comm_out_us: float = _f(NUMBER)
    memory_bytes: int = _f(int)
    capacity_bytes: int = _f(int)
    forward_us: float | None = _f(NUMBER + (NoneType,), None, omit_none=True)  # training plans only
    backward_us: float | None = _f(NUMBER + (NoneType,), None, omit_none=True)
    pipeline: int | None = _f((int, NoneType), None, omit_none=True)  # its pipeline, in a plan of several

    @property
    def transfer_us(self) -> float:
        return self.comm_in_us + self.comm_out_us

    @property
    def plan_forward_us(self) -> float:
        """The stage's forward of one microbatch: compute_us is forward + backward in a training plan."""
        return self.compute_us if self.forward_us is None else self.forward_us

    @property
    def slot_devices(self) -> list[str]:
        """The devices this stage's slot holds (a plan before slots: its one device)."""
        return self.devices or [self.device]


def simulation_inputs(stages: list[StageReport], training: bool) -> tuple[list[int], list[int], list[int] | None]:
    """`stages` as `simulate` plays them, ns: each stage's forward, each boundary's transfer, and in training each
    stage's backward (None in inference). A training plan's compute_us is forward + backward and its comm_out_us
    carries the activations and their gradients, half each way (NOTE [training costs] in passes/lower.py)."""
    ns = lambda us: round(us * 1000)  # noqa: E731
    if training:
        return ([ns(s.plan_forward_us) for s in stages],
                [ns(s.comm_out_us) // 2 for s in stages[:-1]], [ns(s.backward_us or 0.0) for s in stages])
    return [ns(s.compute_us) for s in stages], [ns(s.comm_out_us) for s in stages[:-1]], None


@dataclass(frozen=True, kw_only=True)
class PipelineReport:
    """One of several data-parallel pipelines (NOTE [plan.json fields]): its devices, share and stages."""
    index: int = _f(int)
    microbatches: int = _f(int)  # its share of the global batch
    devices: list[str] = _f(list)  # the device group it was planned on
    time_us: float = _f(NUMBER)  # its stages' time for its microbatches (NOTE [pipelines plan])
    bottleneck_us: float = _f(NUMBER)
    lower_bound_us: float | None = _f(NUMBER + (NoneType,))  # null: none of its own (NOTE [a pipeline's own bound])
    solver_status: str = _f(str)
    stages: list[StageReport] = _f(list, items=StageReport)
    layers: dict | None = _f((dict, NoneType), None, omit_none=True)  # its plan rounded to whole modules (`export`)


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    """plan.json: the plan, its bound and gap, the inputs it was made from, and what other tools would plan."""
    format_version: int = _f(int, FORMAT_VERSION)
    hetpart_version: str = _f(str, "")
    model: ModelRecord = _f(dict, items=ModelRecord)
    cluster: ClusterRecord = _f(dict, items=ClusterRecord)
    mode: str = _f(str, "inference", words=PLAN_MODES)
    schedule: str = _f(str, "gpipe", words=PLAN_SCHEDULES)
    objective: str = _f(str, "throughput")
    microbatches: int = _f(int)
    microbatch_size: int = _f(int)
    bottleneck_us: float = _f(NUMBER)
    lower_bound_us: float = _f(NUMBER)
    gap: float = _f(NUMBER)
    solver_status: str = _f(str)
    certificate: dict | None = _f((dict, NoneType), None)
    predicted_samples_per_s: float | None = _f(NUMBER + (NoneType,), None)
    stages: list[StageReport] = _f(list, items=StageReport)
    weights: str = _f(str, "included")  # or "manifest": traced on meta, `shard-weights` fills them
    dynamic: dict | None = _f((dict, NoneType), None)  # NOTE [dynamic sequence length]
    outputs: dict | list | None = _f((dict, list, NoneType), None)  # NOTE [model outputs] in export.py
    optimizer_bytes_per_param: int | None = _f((int, NoneType), None, omit_none=True)  # training plans only
    baselines: list[dict] = _f(list, factory=list)
    bounds: dict | None = _f((dict, NoneType), None)
    strategy: str = _f(str, "optimal")  # or the baseline whose plan the artifacts run (NOTE [--strategy])
    emulation: dict | None = _f((dict, NoneType), None)  # for `run --emulate` (NOTE [emulated devices])
    align: str = _f(str, "ops")  # "layers": planned with cuts only between modules (`--align layers`)
    layers: dict | None = _f((dict, NoneType), None)  # the plan rounded to whole modules, for `hetpart export`
    replan: dict | None = _f((dict, NoneType), None, omit_none=True)  # `hetpart replan`: bytes moved (hetpart/replan.py)
    # Virtual stages (issue 23): each device runs this many stages, stage k on the k mod D-th (NOTE [virtual stages
    # plan] in partitioner/virtual.py); left out of a plan without them.
    virtual_stages: int | None = _f((int, NoneType), None, omit_none=True)
    # `--schedule auto` / `--microbatches auto`: the candidates and the choice (NOTE [schedule choice] in
    # partitioner/schedule_choice.py); left out of a plan whose schedule and M were given.
    schedule_choice: dict | None = _f((dict, NoneType), None, omit_none=True)
    # Several data-parallel pipelines (issue 19); all left out for one pipeline (NOTE [plan.json fields]).
    pipelines: list[PipelineReport] | None = _f((list, NoneType), None, omit_none=True, items=PipelineReport)
    iteration_us: float | None = _f(NUMBER + (NoneType,), None, omit_none=True)  # slowest pipeline + grad sync
    grad_sync_us: float | None = _f(NUMBER + (NoneType,), None, omit_none=True)  # NOTE [gradient sync]
    grad_sync_overlapped_us: float | None = _f(NUMBER + (NoneType,), None, omit_none=True)
    devices_used: list[str] | None = _f((list, NoneType), None, omit_none=True)
    devices_idle: dict | None = _f((dict, NoneType), None, omit_none=True)  # device -> why no stage runs on it
    # What the pipelines' lower bound covers and leaves out (PipelinesPlan.bound_note, in words), and the parts of
    # it the time limit cut (PipelinesPlan.bound_unfinished: `sync`, `stage sums`, `memory`; `pipelines` where the
    # whole LP bound was cut, `search-free` where a TP degree's search-free bound was not begun; left out when none),
    # so a gap read off a cut bound is not taken for one of a whole bound.
    bound_note: str | None = _f((str, NoneType), None, omit_none=True)
    bound_unfinished: list[str] | None = _f((list, NoneType), None, omit_none=True)
    # A plan chosen over several problems (`--max-tensor-parallel`): each one's value, bound, `bounds` and
    # `certificate`, the one whose bound is `lower_bound_us` marked `taken` (NOTE [bound over a union] in
    # partitioner/tp_choice.py); the top-level `bounds` and `certificate` are the taken one's, with its `problem`.
    bound_problems: list | None = _f((list, NoneType), None, omit_none=True)
    # `--parallel data`'s search: its stats (seconds, shapes tried and solved, NOTE [join probe]'s join_tries,
    # join_solves, join_taken, join_seconds, join_finished); left out of other plans.
    search_stats: dict | None = _f((dict, NoneType), None, omit_none=True)

    @property
    def training(self) -> bool:
        return self.mode == "training"

    def share_of_bottleneck(self, stage: StageReport) -> float:
        return stage.predicted_time_us / (self.bottleneck_us or 1)

    def to_json(self) -> dict[str, Any]:
        return as_json(self)


def as_json(obj: Any) -> Any:
    """A record of this module (or a list of them) as plan.json writes it: keys in field order."""
    if dataclasses.is_dataclass(obj):
        return {f.name: as_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata["omit_none"] and getattr(obj, f.name) is None)}
    if isinstance(obj, list):
        return [as_json(x) for x in obj]
    return obj


def _kind_name(kind: Any) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if set(kinds) - {NoneType} == set(NUMBER):
        return "number"
    return " or ".join("null" if k is NoneType else k.__name__ for k in kinds)


def _from_json(cls: type, table: Any, path: Path, where: str) -> Any:
    if not isinstance(table, dict):
        raise HetpartError(f"{path}: {where.rstrip('.') or 'the plan'} must be an object; the plan was edited or truncated: {REDO}")
    values = {}
    for f in dataclasses.fields(cls):
        kind, items = f.metadata["kind"], f.metadata["items"]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in table and not required:
            continue
        value = table.get(f.name)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise HetpartError(f"{path}: {where}{f.name!r} is missing or not a {_kind_name(kind)} "
                               f"(got {value!r:.40}); the plan was edited or truncated: {REDO}")
        if f.metadata["words"] is not None and value not in f.metadata["words"]:
            raise HetpartError(f"{path}: {where}{f.name!r} is {value!r:.40}, expected one of "
                               f"{', '.join(f.metadata['words'])}; the plan was edited or truncated: {REDO}")
        if items is not None and isinstance(value, list):
            value = [_from_json(items, v, path, f"{where}{f.name}[{k}].") for k, v in enumerate(value)]
        elif items is not None and value is not None:
            value = _from_json(items, value, path, f"{where}{f.name}.")
        values[f.name] = value
    return cls(**values)


def load_plan(path: Path, data: dict[str, Any]) -> PlanReport:
    """The plan of plan.json's parsed `data` (`path` names it in errors); every field's type checked
    (NOTE [plan.json fields])."""
    plan = _from_json(PlanReport, data, path, "")
    if not plan.stages:
        raise HetpartError(f"{path}: 'stages' is empty; {REDO}")
    for name in ("microbatches", "microbatch_size"):  # export wrote an empty schedule CSV for 0 microbatches
        if getattr(plan, name) < 1:
            raise HetpartError(f"{path}: {name!r} is {getattr(plan, name)}, expected 1 or more; the plan was edited or "
                               f"truncated: {REDO}")
    for k, stage in enumerate(plan.stages):
        if stage.index != k and plan.pipelines is None:
            raise HetpartError(f"{path}: stages[{k}].'index' is {stage.index}, expected {k}; the plan was edited or "
                               f"truncated: {REDO}")
        if not all(isinstance(d, str) for d in stage.devices):
            raise HetpartError(f"{path}: stages[{k}].'devices' must be device names; the plan was edited or "
                               f"truncated: {REDO}")
    if plan.pipelines is not None:
        _check_pipelines(path, plan)
    return plan


def _check_pipelines(path: Path, plan: PlanReport) -> None:
    """A plan of several pipelines: each numbered in order with its stages numbered within it, the top-level
    stages theirs in rank order, the shares adding up to the batch (NOTE [plan.json fields])."""
    edited = f"the plan was edited or truncated: {REDO}"
    pipelines = plan.pipelines or []
    for p, pipe in enumerate(pipelines):
        if pipe.index != p or not pipe.stages or pipe.microbatches < 1:
            raise HetpartError(f"{path}: pipelines[{p}] must be pipeline {p} with stages and >= 1 microbatch; {edited}")
        for k, stage in enumerate(pipe.stages):
            if stage.index != k or stage.pipeline != p:
                raise HetpartError(f"{path}: pipelines[{p}].stages[{k}] must be stage {k} of pipeline {p}; {edited}")
    if plan.stages != [s for pipe in pipelines for s in pipe.stages]:
        raise HetpartError(f"{path}: 'stages' must be the pipelines' stages in rank order; {edited}")
    if sum(pipe.microbatches for pipe in pipelines) != plan.microbatches:
        raise HetpartError(f"{path}: the pipelines' microbatches add up to "
                           f"{sum(pipe.microbatches for pipe in pipelines)}, 'microbatches' is {plan.microbatches}; "
                           f"{edited}")


__all__ = ["ClusterDevice", "ClusterRecord", "ModelRecord", "PipelineReport", "PlanReport", "StageReport", "as_json",
           "load_plan"]
