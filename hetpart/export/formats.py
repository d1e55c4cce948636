"""A plan as the config each framework takes: torchtitan, Megatron-LM, DeepSpeed, accelerate,
and torch.distributed.pipelining's schedule CSV.

Every writer reads plan.json (a dict) only: the layer-level ones its `layers` section
(hetpart/export/layers.py), so torch is never imported. The schemas each follows are
cited at the writer; none of these libraries but accelerate installs here, so
tests/export/ checks the others' formats against the same sources.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from hetpart.errors import REDO_PARTITION, HetpartError
from hetpart.export.layers import LayerPlan
from hetpart.export.replicas import (
    Replicas, gpu_ordinals, launch_notes, one_block_per_machine, pipelines_of, replicas, stage_devices,
)
from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES, rank_orders

FORMATS = ("torchtitan", "megatron", "deepspeed", "accelerate", "schedule-csv")


@dataclass
class Exported:
    """What `hetpart export` writes: the config text, files beside it, and notes for the user."""

    text: str
    extra_files: dict[str, str] = field(default_factory=dict)  # suffix of --out's name -> text (torchtitan's CSV)
    notes: list[str] = field(default_factory=list)
    main_file: bool = True  # False: only `extra_files` are written (NOTE [one CSV per pipeline])


def layer_plan(pj: dict, fmt: str, where: str = "plan.json") -> LayerPlan:
    """plan.json's layer-rounded plan (or one pipeline's, of a plan of several: `pj` is then that pipeline's
    record, `where` names it), or an error that says why a layer-level format cannot be written."""
    data = pj.get("layers")
    if pj.get("virtual_stages"):  # NOTE [virtual stages plan]: no layer rounding of them yet
        raise HetpartError(f"--format {fmt}: this plan has {pj['virtual_stages']} virtual stages per device, which "
                           "hetpart does not round to whole modules yet; use --format schedule-csv, or partition "
                           "without an interleaved --schedule")
    if "layers" not in pj:
        raise HetpartError(f"--format {fmt}: {where} has no `layers` section (written by an older hetpart); "
                           f"{REDO_PARTITION}")
    if data is None:
        raise HetpartError(f"--format {fmt} places whole modules, but {where} has no layer-rounded plan: the model "
                           "has no submodules (every op is at its top level; use --format schedule-csv), or the plan "
                           f"was written by an older hetpart: {REDO_PARTITION}")
    edited = f"{where}'s `layers` (the plan rounded to whole layers) was edited or truncated: {REDO_PARTITION}"
    try:
        lp = LayerPlan.from_json(data)
    except ValueError as err:
        raise HetpartError(f"--format {fmt}: {edited} ({err})") from None
    unknown = sorted(set(lp.devices) - {s["device"] for s in pj["stages"]})
    if unknown:
        raise HetpartError(f"--format {fmt}: {edited} (its devices {', '.join(unknown)} run no stage of the plan)")
    return lp


def replicas_of(pj: dict, fmt: str) -> Replicas:
    """The plan as identical replicas of one layer-rounded pipeline (NOTE [identical replicas]), or an error."""
    if pj.get("virtual_stages"):
        layer_plan(pj, fmt)  # refuses them
    return replicas(pj, fmt, layer_plan)


def rounding_note(lp: LayerPlan, pj: dict, idle: list[str] | None = None) -> str:
    """What rounding an op-level plan to whole layers costs, in the plan's own cost model, and which of its devices
    the rounding leaves without a layer (review22: a 3-stage plan was exported as 2 stages without a word); `idle`:
    those of several pipelines rounded alike."""
    note = _rounding_note(lp)
    if lp.shared:
        note += (f"; {', '.join(lp.shared[:4])} run(s) at several places with other modules between, listed at "
                 "the stage of the first call")
    if idle is None:
        idle = [s["device"] for s in pj["stages"] if s["device"] not in lp.devices]
    if idle:
        note += (f"; {len(lp.devices)} of the plan's {len(pj['stages'])} stages keep a whole layer: "
                 f"{', '.join(idle)} would stay idle, and the config has {len(lp.devices)} stages")
    return note


def rounding_notes(pj: dict, rep: Replicas) -> list[str]:
    """`rounding_note` of each pipeline; pipelines with the same note named once together."""
    pipelines = pipelines_of(pj)
    if len(pipelines) == 1:
        return [rounding_note(rep.lp, pj)]
    alike: dict[tuple, list[int]] = {}  # the same rounding, on each pipeline's own devices: one note
    for p, lp in enumerate(rep.plans):
        key = (tuple(lp.split_by_plan), tuple(lp.rounded_stage_us), lp.bottleneck_us, tuple(lp.over_memory_stages),
               len(lp.devices))
        alike.setdefault(key, []).append(p)
    notes = []
    for ps in alike.values():
        idle = [s["device"] for p in ps for s in pipelines[p]["stages"] if s["device"] not in rep.plans[p].devices]
        note = rounding_note(rep.plans[ps[0]], pipelines[ps[0]], idle)
        notes.append(note.replace("note: the plan", f"note: pipeline(s) {', '.join(map(str, ps))}: the plan", 1))
    return notes


def _rounding_note(lp: LayerPlan) -> str:
    if lp.aligned:
        return (f"note: the plan cuts only between layers; its predicted bottleneck, {lp.rounded_bottleneck_us:g} us "
                "per microbatch, carries over")
    loss = (lp.rounded_bottleneck_us / lp.bottleneck_us - 1) * 100 if lp.bottleneck_us else 0.0
    shown = ", ".join(lp.split_by_plan[:6]) + (", ..." if len(lp.split_by_plan) > 6 else "")
    memory = (f"; rounded stage(s) {', '.join(map(str, lp.over_memory_stages))} exceed their device's memory"
              if lp.over_memory_stages else "")
    return (f"note: the plan cuts inside {len(lp.split_by_plan)} layer(s) ({shown}); rounded to whole layers its "
            f"predicted bottleneck is {lp.rounded_bottleneck_us:g} us per microbatch against {lp.bottleneck_us:g} us "
            f"op by op ({loss:+.1f}%){memory}; `hetpart partition --align layers` plans with whole layers")


def _header(pj: dict, fmt: str, rep: Replicas | None, comment: str = "#") -> list[str]:
    model = pj["model"]["model"]
    lines = [f"{comment} hetpart export --format {fmt}: {model} on {pj['cluster']['name']}, "
             f"{pj['mode']}, microbatch of {pj['microbatch_size']}"]
    types = {d["name"]: d["type"] for d in pj["cluster"]["devices"]}
    if rep is not None:
        if rep.pipelines > 1 or rep.degree > 1:
            lines.append(f"{comment} {rep.pipelines} data-parallel replica(s) of {rep.stages} stage(s), "
                         f"tensor-parallel degree {rep.degree}, {rep.microbatches} microbatch(es) each")
        for k, layers in enumerate(rep.lp.layers_of_stage()):
            # Each replica's stage k on its own devices' type and time: pipelines of other types (a --parallel data
            # plan's A100 and T4 replicas) were all shown as pipeline 0's.
            kinds = [(types[group[k][0]], lp.rounded_stage_us[k]) for group, lp in zip(rep.devices, rep.plans)]
            groups = ["+".join(group[k]) for group in rep.devices]
            if len(set(kinds)) == 1:
                where = " | ".join(groups) + f" ({kinds[0][0]}), {kinds[0][1]:g} us"
            else:
                where = " | ".join(f"{g} ({ty}, {us:g} us)" for g, (ty, us) in zip(groups, kinds))
            lines.append(f"{comment} stage {k}: {where}: " + ", ".join(layers))
    return lines


# --- torch.distributed.pipelining's schedule CSV -------------------------------------------------

def schedule_rows(num_stages: int, microbatches: int, schedule: str, ranks: int | None = None) -> list[list[str]]:
    """Rank k's actions (it runs stage k), as torch's `_Action` strings: `2F0` is stage 2's forward of
    microbatch 0, `2B0` its full backward. An interleaved schedule's stages run on `ranks` ranks, stage k
    on rank k mod ranks, in `simulate.rank_orders`'s order (NOTE [virtual-stage schedules]; zero bubble's
    `2I0`, `2W0` are its input and weight gradients).

    GPipe runs every forward, then every backward; 1F1B warms up with S-1-k forwards, then
    alternates one forward and one backward, then drains the backwards: the orders of torch's
    `ScheduleGPipe` and `Schedule1F1B` (`_get_pipeline_order` in torch/distributed/pipelining/schedules.py).
    """
    if schedule in VIRTUAL_SCHEDULES:
        v = num_stages // (ranks or num_stages)
        return [[str(a) for a in order] for order in rank_orders(schedule, num_stages // v, v, microbatches)]
    rows = []
    for k in range(num_stages):
        if schedule == "gpipe":
            actions = [f"{k}F{i}" for i in range(microbatches)] + [f"{k}B{i}" for i in range(microbatches)]
        else:
            warm = min(num_stages - 1 - k, microbatches)
            actions = [f"{k}F{i}" for i in range(warm)]
            forward, backward = warm, 0
            while forward < microbatches:
                actions += [f"{k}F{forward}", f"{k}B{backward}"]
                forward, backward = forward + 1, backward + 1
            actions += [f"{k}B{i}" for i in range(backward, microbatches)]
        rows.append(actions)
    return rows


def schedule_csv(num_stages: int, microbatches: int, schedule: str, ranks: int | None = None) -> str:
    """The CSV `PipelineScheduleMulti._load_csv` reads (format "compute_only"): one row per rank, one
    action per cell, as `_dump_csv` writes it (torch/distributed/pipelining/schedules.py)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(schedule_rows(num_stages, microbatches, schedule, ranks))
    return buf.getvalue()


def _stage_map_notes(pj: dict) -> list[str]:
    ranks = len(pj["stages"]) // (pj.get("virtual_stages") or 1)  # stage k on rank k mod ranks
    return [f"note: stage {s['index']} -> rank {s['index'] % ranks}: {s['device']} ({s['device_type']}, machine "
            f"{s['machine']})" for s in pj["stages"]]


def export_schedule_csv(pj: dict, out_name: str | None = None) -> Exported:
    """hetpart's own stages (rank k runs stage k: NOTE [ranks are stages]) and the plan's schedule and M.
    The runtime's validator expects a backward for every forward, so the CSV is a training step's
    order even for an inference plan. A plan of several data-parallel pipelines: one CSV per pipeline
    (NOTE [one CSV per pipeline]); `out_name`, --out's name, names them."""
    notes = []
    if pj["mode"] != "training":
        notes.append("note: an inference plan: the CSV holds the training step's order (torch's schedule "
                     "runtime runs a backward for every forward)")
    tp = any(len(stage_devices(s)) > 1 for s in pj["stages"])
    if tp:
        notes.append("note: a stage on a tensor-parallel group: every rank of the group runs its stage's row (a "
                     "PipelineStage per rank, its group the ranks of the same TP index across the stages)")
    pipelines = pipelines_of(pj)
    if len(pipelines) == 1:
        ranks = len(pj["stages"]) // (pj.get("virtual_stages") or 1)
        text = schedule_csv(len(pj["stages"]), pj["microbatches"], pj["schedule"], ranks)
        return Exported(text, notes=(_stage_map_notes(pj) if not tp else _group_map_notes(pipelines)) + notes)
    if out_name is None:
        raise HetpartError(f"--format schedule-csv: this plan has {len(pipelines)} data-parallel pipelines, one CSV "
                           "each (torch's schedule runs one pipeline): pass --out FILE.csv to write FILE.pipeline0.csv"
                           f" .. FILE.pipeline{len(pipelines) - 1}.csv (not `-`: stdout holds one file)")
    extra = {f".pipeline{q['index']}.csv": schedule_csv(len(q["stages"]), q["microbatches"], pj["schedule"])
             for q in pipelines}
    stem = out_name.rsplit(".", 1)[0] if "." in out_name.rpartition("/")[2] else out_name
    notes = _group_map_notes(pipelines) + [
        f"note: wrote one CSV per pipeline, {stem}.pipeline<p>.csv, each with its own share of microbatches; rank r "
        "of a CSV is stage r of that pipeline (its ranks listed above, in hetpart's numbering)"] + notes
    shares = [q["microbatches"] for q in pipelines]
    if len(set(shares)) > 1:
        notes.append(f"note: the pipelines take {'/'.join(map(str, shares))} microbatches: average the gradients "
                     "weighted by these shares (a plain all-reduce mean weights the replicas equally)")
    return Exported("", extra_files=extra, notes=notes, main_file=False)


# NOTE [one CSV per pipeline]
# torch.distributed.pipelining's CSV (`_load_csv`) is one pipeline's schedule: row r is the actions of
# that pipeline group's rank r. A plan of P data-parallel pipelines runs P such groups, each with its own
# stage count and share of the microbatches, so `--out FILE.csv` writes FILE.pipeline0.csv ..
# FILE.pipeline{P-1}.csv and no FILE.csv; without --out (or with `-`, stdout) it is refused, as stdout
# holds one file. The notes list each pipeline's ranks (hetpart's numbering: pipeline-major, each stage's
# TP group together) and devices.


def _group_map_notes(pipelines: list[dict]) -> list[str]:
    notes, rank = [], 0
    for q in pipelines:
        where = []
        for s in q["stages"]:
            group = stage_devices(s)
            ranks = f"rank {rank}" if len(group) == 1 else f"ranks {rank}..{rank + len(group) - 1}"
            where.append(f"stage {s['index']} -> {ranks}: {'+'.join(group)} ({s['device_type']}, machine "
                         f"{s['machine']})")
            rank += len(group)
        notes.append(f"note: pipeline {q['index']} ({q['microbatches']} microbatch(es)): " + "; ".join(where))
    return notes


# --- torchtitan ---------------------------------------------------------------------------------

def _toml_list(items: list) -> str:
    return json.dumps(items)  # a JSON array of strings is a TOML array


def export_torchtitan(pj: dict, csv_path: str | None) -> Exported:
    """torchtitan's `[parallelism]` table (torchtitan/config/job_config.py, class Parallelism):
    `module_fqns_per_model_part: list[list[str]]`, one list of module FQNs per model part, and
    `pipeline_parallel_schedule_csv`, a path whose schedule needs `pipeline_parallel_schedule` to
    be PipelineScheduleSingle, PipelineScheduleMulti or _PipelineScheduleRuntime. Without a CSV
    path (no --out), the plan's schedule by name ("GPipe" or "1F1B", torch's get_schedule_class).
    Data-parallel replicas are `data_parallel_replicate_degree` (DDP) or `data_parallel_shard_degree`
    (FSDP) as NOTE [torchtitan's data parallelism] says, and `[training] local_batch_size`, each replica's
    share: torchtitan's microbatches are local_batch_size / pipeline_parallel_microbatch_size (its default,
    8, would not be the plan's). Its mesh is pp, dp_replicate, dp_shard, cp, tp, outermost first (ParallelDims
    in torchtitan/distributed/parallel_dims.py): the launch notes list the ranks in that order."""
    rep = replicas_of(pj, "torchtitan")
    parts = rep.lp.layers_of_stage()
    mbs = pj["microbatch_size"]
    fsdp = rep.pipelines > 1 and (len(parts) > 1 or rep.degree > 1)  # NOTE [torchtitan's data parallelism]
    lines = _header(pj, "torchtitan", rep) + [
        "# FQNs are the traced model's module names: they apply to a torchtitan model with the same ones",
        "[parallelism]",
        f"pipeline_parallel_degree = {len(parts)}",
        f"data_parallel_replicate_degree = {1 if fsdp else rep.pipelines}",
        f"data_parallel_shard_degree = {rep.pipelines if fsdp else 1}",
        f"tensor_parallel_degree = {rep.degree}",
        f"pipeline_parallel_microbatch_size = {mbs}",
    ]
    extra = {}
    if csv_path is not None:
        lines += ['pipeline_parallel_schedule = "PipelineScheduleMulti"',
                  f"pipeline_parallel_schedule_csv = {json.dumps(csv_path)}"]
        extra[".schedule.csv"] = schedule_csv(len(parts), rep.microbatches, pj["schedule"])
    else:
        lines.append(f"pipeline_parallel_schedule = {json.dumps({'gpipe': 'GPipe', '1f1b': '1F1B'}[pj['schedule']])}")
    lines.append("module_fqns_per_model_part = [")
    lines += [f"    {_toml_list(p)}," for p in parts]
    lines += ["]", "[training]", f"local_batch_size = {mbs * rep.microbatches}",
              f"global_batch_size = {mbs * rep.microbatches * rep.pipelines}"]
    notes = rounding_notes(pj, rep) + _tp_note(rep, "torchtitan applies its model's own TP plan (parallelize_fn)")
    if fsdp:
        notes.append(f"note: the {rep.pipelines} data-parallel replicas are FSDP's (data_parallel_shard_degree), as "
                     "torchtitan runs DDP only without pipeline or tensor parallelism: FSDP shards each stage's "
                     "weights, gradients and optimizer state over its replicas, so a rank holds less than the plan "
                     "counts, and the step gathers the weights and reduce-scatters the gradients where the plan "
                     "costs an all-reduce (NOTE [torchtitan's data parallelism])")
    notes += launch_notes(pj, rep.rank_devices("pp-dp-tp"),
                          f"torchtitan's (pp, {'dp_shard' if fsdp else 'dp_replicate'}, tp)")
    if csv_path is None:
        notes.append("note: pass --out FILE to also write FILE's schedule CSV (pipeline_parallel_schedule_csv)")
    return Exported("\n".join(lines) + "\n", extra, notes)


# NOTE [torchtitan's data parallelism]
# hetpart's data-parallel pipelines replicate their weights (each replica holds its stages' whole state and the
# gradients are all-reduced), which is torchtitan's DDP, `data_parallel_replicate_degree = P` with
# `data_parallel_shard_degree = 1` (its default, -1, would shard over the ranks left over). But torchtitan applies
# DDP only when it is the one parallelism: parallelize_llama raises "DDP has not supported > 1D parallelism" when
# the world is larger than the dp_replicate mesh (torchtitan/models/llama3/infra/parallelize.py), and HSDP needs a
# shard degree above 1. So P replicas of a pipeline of several stages, or of TP stages, are written as FSDP,
# `data_parallel_shard_degree = P` (the same mesh position, between pp and tp, and the same batch: torchtitan's
# data-parallel degree is dp_replicate x dp_shard), and a note says what differs from the plan: each rank holds 1/P
# of its stage's state, and the gradient all-reduce becomes FSDP's all-gathers and reduce-scatters.


def _tp_note(rep: Replicas, how: str) -> list[str]:
    if rep.degree == 1:
        return []
    return [f"note: tensor-parallel degree {rep.degree}: {how}, which may split other weights than hetpart's plan "
            "(sharding found on the graph, `hetpart inspect`): the predicted times are of hetpart's split"]


# --- Megatron-LM --------------------------------------------------------------------------------

BLOCK = re.compile(r"(.+)\.(\d+)")


def decoder_blocks(names: list[str], fmt: str) -> tuple[int, int]:
    """The [first, last] index in `names` of the model's one stack of repeated blocks (`blocks.N`,
    `model.layers.N`): what Megatron calls decoder layers. Layers before it are the embedding,
    after it the loss (final norm and head)."""
    prefixes = Counter(m.group(1) for name in names if (m := BLOCK.fullmatch(name)))
    if not prefixes:
        raise HetpartError(f"--format {fmt}: the model has no stack of repeated blocks (layers named like "
                           f"`blocks.0`; it has {', '.join(names[:5])}); Megatron's layout counts decoder layers")
    stacks = [p for p, count in prefixes.most_common() if count > 1]
    if len(stacks) > 1:
        raise HetpartError(f"--format {fmt}: the model has {len(stacks)} stacks of blocks ({', '.join(f'`{p}.N`' for p in stacks[:3])}); "
                           "Megatron's layout describes one stack of decoder layers between embedding and loss")
    prefix = prefixes.most_common(1)[0][0]
    index = [i for i, name in enumerate(names) if (m := BLOCK.fullmatch(name)) and m.group(1) == prefix]
    inside = names[index[0]:index[-1] + 1]
    strangers = [name for name in inside if not ((m := BLOCK.fullmatch(name)) and m.group(1) == prefix)]
    if strangers:
        raise HetpartError(f"--format {fmt}: layers {', '.join(strangers[:4])} run between the `{prefix}.N` blocks; "
                           "Megatron's layout describes one stack of decoder layers between embedding and loss")
    return index[0], index[-1]


def megatron_layout(lp: LayerPlan) -> str:
    """`--pipeline-model-parallel-layout` (megatron/core/transformer/pipeline_parallel_layer_layout.py):
    stages split by `|`, `E` embedding, `t` a decoder layer, `L` the loss, `x*N` repeats, commas
    cosmetic; the first layer must be E and the last L, each exactly once."""
    first, last = decoder_blocks(lp.names, "megatron")
    stages = []
    for k in range(len(lp.devices)):
        count = sum(1 for i in range(first, last + 1) if lp.stage_of_layer[i] == k)
        cell = "t" if count == 1 else f"t*{count}" if count else ""
        if k == 0:
            cell = "E" + cell
        if k == len(lp.devices) - 1:
            cell = cell + ("," if cell else "") + "L"
        stages.append(cell)
    return "|".join(stages)


def export_megatron(pj: dict) -> Exported:
    """Megatron-LM's arguments (megatron/training/arguments.py): the layout as above; TP as
    --tensor-model-parallel-size; data parallelism is implied, world size / (TP x PP), and the
    replicas' share as --global-batch-size over --micro-batch-size (Megatron runs global / (micro x DP)
    microbatches per replica). Its ranks go tp fastest, then dp, then pp (megatron/training/initialize.py: order
    "tp-cp-ep-dp-pp"); where that splits a machine's ranks and --use-tp-pp-dp-mapping's order ("tp-cp-ep-pp-dp",
    hetpart's own numbering: each pipeline's ranks together) does not, the export adds that flag, so torchrun
    can start each machine's ranks (NOTE [identical replicas])."""
    rep = replicas_of(pj, "megatron")
    lp = rep.lp
    first, last = decoder_blocks(lp.names, "megatron")
    counts = [sum(1 for i in range(first, last + 1) if lp.stage_of_layer[i] == k) for k in range(len(lp.devices))]
    notes = rounding_notes(pj, rep)
    pre, post = lp.names[:first], lp.names[last + 1:]
    if {lp.stage_of_layer[i] for i in range(first)} - {0} or {lp.stage_of_layer[i] for i in
                                                             range(last + 1, len(lp.names))} - {len(counts) - 1}:
        notes.append(f"note: the plan puts embedding or head layers ({', '.join(pre + post)}) on inner stages; "
                     "Megatron keeps E on the first stage and L on the last")
    mbs = pj["microbatch_size"]
    by_pipeline = rep.rank_devices("dp-pp-tp")
    mapping = (" --use-tp-pp-dp-mapping" if not one_block_per_machine(pj, rep.rank_devices("pp-dp-tp"))
               and one_block_per_machine(pj, by_pipeline) else "")
    lines = _header(pj, "megatron", rep) + [
        f"# embedding (E): {', '.join(pre) or 'none'}; decoder layers (t): {lp.names[first]} .. {lp.names[last]}; "
        f"loss (L): {', '.join(post) or 'none'}",
        f"# world size {rep.pipelines * rep.stages * rep.degree}: data-parallel size {rep.pipelines} = world size / "
        f"(tensor {rep.degree} x pipeline {rep.stages})",
        f"--tensor-model-parallel-size {rep.degree} --pipeline-model-parallel-size {len(counts)} "
        f"--num-layers {sum(counts)} --pipeline-model-parallel-layout \"{megatron_layout(lp)}\" "
        f"--micro-batch-size {mbs} --global-batch-size {mbs * rep.microbatches * rep.pipelines}{mapping}",
    ]
    inner = counts[1:-1]
    if len(counts) > 2 and len(set(inner)) == 1 and inner[0] > 0:
        lines.append(f"# or, the same split: --decoder-first-pipeline-num-layers {counts[0]} "
                     f"--decoder-last-pipeline-num-layers {counts[-1]}")
    notes += _tp_note(rep, "Megatron splits its own layers (ColumnParallelLinear, RowParallelLinear)")
    order = "Megatron's --use-tp-pp-dp-mapping (dp, pp, tp)" if mapping else "Megatron's (pp, dp, tp)"
    notes += launch_notes(pj, by_pipeline if mapping else rep.rank_devices("pp-dp-tp"), order)
    return Exported("\n".join(lines) + "\n", notes=notes)


# --- DeepSpeed ----------------------------------------------------------------------------------

def deepspeed_parts(lp: LayerPlan) -> tuple[list[str], list[int]]:
    """The layers in stage order and `PipelineModule.parts` (deepspeed/runtime/pipe/module.py,
    `_partition_layers` and `stage_owner`): S+1 boundaries, stage s owns layers parts[s] <= i < parts[s+1]."""
    layers = [name for k in range(len(lp.devices)) for name, s in zip(lp.names, lp.stage_of_layer) if s == k]
    parts = [0]
    for k in range(len(lp.devices)):
        parts.append(parts[-1] + sum(1 for s in lp.stage_of_layer if s == k))
    return layers, parts


def export_deepspeed(pj: dict) -> Exported:
    """`PipelineModule(num_stages=S, topology=...)`'s parts, and its topology (deepspeed/runtime/pipe/topology.py):
    PipeDataParallelTopology(num_pp, num_dp), axes pipe, data; with TP PipeModelDataParallelTopology(num_pp, num_mp,
    num_dp), axes pipe, data, model; the last axis varies fastest. The batch: train_micro_batch_size_per_gpu x
    gradient_accumulation_steps (each replica's microbatches) x the data-parallel size is train_batch_size."""
    rep = replicas_of(pj, "deepspeed")
    lp = rep.lp
    layers, parts = deepspeed_parts(lp)
    topology = ({"class": "PipeModelDataParallelTopology", "num_pp": rep.stages, "num_mp": rep.degree,
                 "num_dp": rep.pipelines} if rep.degree > 1 else
                {"class": "PipeDataParallelTopology", "num_pp": rep.stages, "num_dp": rep.pipelines})
    data = {
        "format": "deepspeed.pipe.PipelineModule parts",
        "num_stages": len(lp.devices),
        "parts": parts,
        "layers": layers,
        "stage_devices": lp.devices,
        "predicted_stage_us": lp.rounded_stage_us,
        "topology": topology,
        "ds_config": {"train_micro_batch_size_per_gpu": pj["microbatch_size"],
                      "gradient_accumulation_steps": rep.microbatches,
                      "train_batch_size": pj["microbatch_size"] * rep.microbatches * rep.pipelines},
        "rank_devices": rep.rank_devices("pp-dp-tp"),
    }
    notes = rounding_notes(pj, rep) + ["note: DeepSpeed's partition_method takes no list: set `self.parts` in a "
                                       "PipelineModule subclass's _partition_layers (README, `hetpart export`)"]
    notes += _tp_note(rep, "DeepSpeed's topology only numbers the TP ranks; the layers must split themselves "
                           "(Megatron-DeepSpeed's mpu)")
    notes += launch_notes(pj, data["rank_devices"], f"DeepSpeed's {topology['class']} (pipe, data, model)")
    return Exported(json.dumps(data, indent=1) + "\n", notes=notes)


# --- accelerate ---------------------------------------------------------------------------------

def accelerate_device_map(pj: dict, lp: LayerPlan) -> dict[str, int | str]:
    """accelerate's `device_map` (module FQN -> a CUDA ordinal or "cpu"; `dispatch_model`): the plan's
    layers on its devices, chosen by speed as well as memory. A GPU's ordinal is its index among its
    machine's non-CPU devices; accelerate runs in one process, so the plan must use one machine."""
    devices = {d["name"]: d for d in pj["cluster"]["devices"]}
    machines = sorted({devices[d]["machine"] for d in lp.devices})
    if len(machines) > 1:
        raise HetpartError(f"--format accelerate: the plan spans machines {', '.join(machines)}, and accelerate "
                           "places a model on one machine's devices; partition for a one-machine cluster, or "
                           "export --format torchtitan, megatron or deepspeed")
    ordinal = gpu_ordinals(pj)
    device_map = {name: ordinal[lp.devices[k]] for name, k in zip(lp.names, lp.stage_of_layer)}
    on_cpu = [name for name, where in device_map.items() if where == "cpu"]
    if on_cpu and len(set(device_map.values())) > 1:  # NOTE [accelerate's cpu]
        shown = ", ".join(on_cpu[:4]) + (", ..." if len(on_cpu) > 4 else "")
        raise HetpartError(f"--format accelerate: the plan runs {shown} on the CPU beside GPUs, but in accelerate's "
                           "device_map \"cpu\" beside a GPU offloads a module's weights to CPU memory and runs it on "
                           "the first GPU (dispatch_model's main_device), not on the CPU: partition for the machine's "
                           "GPUs only (a cluster file without its \"cpu\"), or export --format torchtitan, megatron "
                           "or deepspeed")
    return device_map


# NOTE [accelerate's cpu]
# accelerate's dispatch_model runs a module mapped to "cpu" on its main device, the first GPU of the map,
# with the weights kept in CPU memory and copied over at each forward (execution_device in
# accelerate/big_modeling.py): "cpu" is offloading there, not a place to compute, unless every module
# is on the CPU. A plan that computes some layers on the CPU beside GPUs is refused (review22: the
# README's own example ran its CPU stage on the A100 and said its predicted time carried over). And
# accelerate runs the devices one after another, not as a pipeline, so a plan's per-microbatch
# bottleneck is not its step time there: the note says so.


def export_accelerate(pj: dict) -> Exported:
    pipelines = pipelines_of(pj)
    if len(pipelines) > 1:
        raise HetpartError(f"--format accelerate: the plan runs {len(pipelines)} data-parallel pipelines, and "
                           "accelerate's device_map places one copy of the model in one process (its Accelerator "
                           "refuses to train a dispatched model distributed): export --format torchtitan, megatron "
                           "or deepspeed (identical replicas), or schedule-csv")
    grouped = [s for s in pj["stages"] if len(stage_devices(s)) > 1]
    if grouped:
        raise HetpartError(f"--format accelerate: stage {grouped[0]['index']} runs tensor-parallel on "
                           f"{'+'.join(stage_devices(grouped[0]))}, and accelerate's device_map puts each module on "
                           "one device: partition without --tensor-parallel, or export --format torchtitan, megatron "
                           "or deepspeed")
    lp = replicas_of(pj, "accelerate").lp
    device_map = accelerate_device_map(pj, lp)
    total = round(sum(lp.rounded_stage_us), 3)
    sequential = (f"note: accelerate runs the devices one after another, not as a pipeline: there a microbatch of "
                  f"{pj['microbatch_size']} takes up to the stages' times added up, {total:g} us (each transfer counted "
                  f"on both of its sides), where a pipeline of them takes the bottleneck per microbatch")
    return Exported(json.dumps(device_map, indent=1) + "\n", notes=[rounding_note(lp, pj), sequential])
