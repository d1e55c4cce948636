"""`replan --checkpoint CK`: the bytes a re-plan moves, counted from what a run's checkpoint holds.

NOTE [bytes from a checkpoint]
Without a checkpoint, `replan` counts each weight's state as the plan costs it: its value plus
`--optimizer-bytes-per-param` per parameter (8 by default: Adam's two fp32 moments; `state_to_move_bytes`),
and says so (`basis_line`, plan.json's `replan.bytes_counted`). A run keeps what its optimizer keeps: `run`'s
default SGD (no momentum) none, so those figures were 3x the checkpoint's (spot21b). With `--checkpoint CK`
(a --checkpoint-dir, its newest complete checkpoint taken, or a step-<N> folder) `replan` reads the
checkpoint as `run --resume` does: checkpoint.json, every rank<k>.json and every tensor file, each file's sha256
checked before anything of it is read (rev25: the tensor files' headers were read unchecked, so an edited file
gave its numbers with exit 0, and a symbolic link or a missing file an error about a `.safetensors` argument;
the check is one pass over the checkpoint, which `run --resume` makes again). It counts, per weight, the bytes
of its value and of its optimizer state tensors (`optimizer/<fqn>/<key>`) as they lie there: each tensor's full
shape (rank<k>.json's layout, NOTE [checkpoint slices]; a format-1 part: its header's) times its element size
(its data bytes over its elements in the file's header). `HeldState` carries them on the stored problem, and every
engine reads a weight's bytes through `state_to_move_bytes`: a part of a weight moves its share of the
checkpoint's bytes of it, its bytes in the problem over the checkpoint's value bytes (`HeldState.moved_bytes`):
a stage holding all of it moves all of them, a TP rank's 1/t shard (the TP problem sizes it so,
`costs.tp_shard_bytes`) 1/t of them (NOTE [re-plan by shard]), but for its 0-dim state tensors (Adam's step),
which every rank holds and reads whole (`HeldState.scalar_bytes`; rev25: counted as shares, 4 B x (t-1)/t short
per split weight); `mixed_holdings` adds them to each rank's part of a weight the same way. The problem and the checkpoint size a value
alike: a run trains the artifacts' weights in their dtype.
The checkpoint must be one a run of OLD wrote: the model record `run --resume` checks, and rank k's part
on OLD's rank k's device holding its weights (OLD's manifest says which device holds what, and the bytes are
counted by it). Any other is refused (exit 2): its bytes would be another plan's.
"""

from __future__ import annotations

from math import prod
from pathlib import Path
from typing import Any

from hetpart.errors import HetpartError
from hetpart.partitioner import Problem
from hetpart.partitioner.problem import HeldState
from hetpart.units import format_bytes


def read_held_state(ck: Path, old: Path, manifest: dict[str, Any], plan_model: dict[str, Any],
                    stored: Problem) -> HeldState:
    """NOTE [bytes from a checkpoint]: the bytes per weight of the checkpoint at `ck`, which a run of `old` (its
    `manifest`, plan.json's model record `plan_model`) must have written; `stored`: the plan's problem."""
    from hetpart.runtime.checkpoint import find_checkpoint, read_checkpoint

    try:
        ckpt = read_checkpoint(find_checkpoint(ck))  # every file's sha256 before its header is read
    except HetpartError as err:
        said = str(err).removeprefix(f"--resume {ck}: ").replace("resume from another checkpoint", "pass another one")
        raise HetpartError(f"--checkpoint {ck}: {said}") from None
    check_belongs(ckpt, ck, old, manifest, plan_model)
    value, optimizer, scalar = _tensor_bytes(ckpt, ck)
    missing = sorted(set(stored.weights) - set(value))
    if missing:
        raise HetpartError(f"--checkpoint {ck}: {ckpt.path} holds no tensor of weight(s) {', '.join(missing[:3])} of "
                           f"{old}'s plan: the checkpoint was edited; pass another one")
    kinds = sorted({p["optimizer"]["type"] for p in ckpt.ranks if p["optimizer"]["type"] is not None})
    return HeldState(str(ckpt.path), ckpt.step, "/".join(kinds) or "none", {w: value[w] for w in stored.weights},
                     {w: optimizer.get(w, 0) for w in stored.weights}, {w: scalar.get(w, 0) for w in stored.weights})


def check_belongs(ckpt: Any, ck: Path, old: Path, manifest: dict[str, Any], plan_model: dict[str, Any]) -> None:
    """An error unless a run of `old` wrote `ckpt` (a runtime.checkpoint.Checkpoint): the same model record, and
    rank k's part on the device of `old`'s rank k, holding its weights."""
    from hetpart.runtime.checkpoint import model_record, rank_weights

    refuse = (f"; pass a checkpoint that `hetpart run {old} --checkpoint-dir CK` wrote, or leave --checkpoint out "
              "to count the bytes as the plan costs them")
    model = model_record(plan_model)
    if ckpt.model != model:
        raise HetpartError(f"--checkpoint {ck}: {ckpt.path} is a checkpoint of {ckpt.model.get('model')} "
                           f"{ckpt.model.get('overrides')} (seed {ckpt.model.get('seed')}), {old} is a plan of "
                           f"{model.get('model')} {model.get('overrides')} (seed {model.get('seed')})" + refuse)
    ranks = manifest["ranks"]
    if len(ckpt.ranks) != len(ranks):
        raise HetpartError(f"--checkpoint {ck}: {ckpt.path} was written by {len(ckpt.ranks)} rank(s), {old} runs "
                           f"{len(ranks)}: it is another plan's checkpoint" + refuse)
    for entry, part in zip(ranks, ckpt.ranks):
        if part["device"] != entry.get("planned_device") or sorted(part["weights"]) != rank_weights(entry):
            raise HetpartError(f"--checkpoint {ck}: {ckpt.path}'s rank {part['rank']} held {len(part['weights'])} "
                               f"weight(s) on {part['device']}, {old}'s rank {entry['rank']} holds "
                               f"{len(rank_weights(entry))} on {entry.get('planned_device')}: it is another plan's "
                               "checkpoint" + refuse)


def _tensor_bytes(ckpt: Any, ck: Path) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """weight -> the bytes of its value, of its optimizer state tensors, whole, and of those of them that are 0-dim,
    in `ckpt`'s files (each tensor counted once, from the first part holding it)."""
    from hetpart.codegen.weights import Checkpoint as SafetensorsFile
    from hetpart.runtime.checkpoint import part_layouts

    seen: set[str] = set()
    value: dict[str, int] = {}
    optimizer: dict[str, int] = {}
    scalar: dict[str, int] = {}
    for part in ckpt.ranks:
        layouts = part_layouts(ckpt, part)
        todo = sorted(k for k in layouts if k not in seen)
        if not todo:
            continue
        header = SafetensorsFile(ckpt.path / part["file"])
        for key in todo:
            if key not in header.file_of:
                raise HetpartError(f"--checkpoint {ck}: {ckpt.path / part['file']} holds no tensor {key}, which "
                                   f"rank{part['rank']}.json lists: the checkpoint was edited; pass another one")
            seen.add(key)
            layout = layouts[key]
            local = prod(layout.local_shape())
            nbytes = header.data_bytes(key) * prod(layout.shape) // local if local else 0
            kind, _, rest = key.partition("/")
            if kind not in ("weight", "optimizer") or not rest:
                raise HetpartError(f"--checkpoint {ck}: {ckpt.path / part['file']} holds a tensor {key!r}, neither "
                                   "`weight/<fqn>` nor `optimizer/<fqn>/<key>` (NOTE [checkpoint layout]): it is no "
                                   "checkpoint `hetpart run` wrote; pass another one")
            if kind == "weight":
                value[rest] = value.get(rest, 0) + nbytes
            else:
                fqn = rest.rsplit("/", 1)[0]
                optimizer[fqn] = optimizer.get(fqn, 0) + nbytes
                if layout.shape == ():  # Adam's step: every rank of a TP group reads it whole
                    scalar[fqn] = scalar.get(fqn, 0) + nbytes
    return value, optimizer, scalar


def planned_optimizer_bytes(plan: Any) -> int:
    """The optimizer state per parameter a training plan's memory was costed with (`--optimizer-bytes-per-param`;
    8, CompileOptions' default, where plan.json has none)."""
    return 8 if plan.optimizer_bytes_per_param is None else plan.optimizer_bytes_per_param


def basis_line(held: HeldState | None, plan: Any) -> str | None:
    """What `replan` prints of how it counted the bytes (NOTE [bytes from a checkpoint]); None for an inference
    plan without a checkpoint (its state is its values)."""
    if held is not None:
        v, o = sum(held.value_bytes.values()), sum(held.optimizer_bytes.values())
        return (f"  bytes as checkpoint {held.source} holds them (step {held.step}, {held.optimizer}): values "
                f"{format_bytes(v)}, optimizer state {format_bytes(o)} in all")
    if plan.mode != "training":
        return None
    per = planned_optimizer_bytes(plan)
    return (f"  bytes as the plan costs them: value + {per} B/param of optimizer state (8: Adam's; `run`'s SGD keeps "
            "none); --checkpoint CK counts what it holds")


def basis_record(held: HeldState | None, plan: Any) -> dict[str, Any]:
    """plan.json's `replan.bytes_counted` (NOTE [bytes from a checkpoint])."""
    if held is not None:
        return {"from": "checkpoint", "checkpoint": held.source, "step": held.step, "optimizer": held.optimizer,
                "value_bytes": sum(held.value_bytes.values()), "optimizer_bytes": sum(held.optimizer_bytes.values())}
    return {"from": "plan", "optimizer_bytes_per_param": planned_optimizer_bytes(plan) if plan.mode == "training"
            else None}


__all__ = ["basis_line", "basis_record", "check_belongs", "planned_optimizer_bytes", "read_held_state"]
