"""The structure of a checkpoint's manifest, checkpoint.json (NOTE [checkpoint layout] in runtime/checkpoint.py),
checked before anything it names is read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetpart.errors import HetpartError
from hetpart.fsio import CHECKPOINT_STEP_DIR


def check_manifest_fields(path: Path, manifest: dict[str, Any], bad: Callable[[str], HetpartError]) -> None:
    """An error unless checkpoint.json holds what `finish_checkpoint` writes: the step its folder is named by, the
    data position and model as tables, rank k's part at place k naming rank<k>.safetensors, and the hashes of
    rank<k>.json for exactly those ranks (review23: a manifest edited by hand gave a traceback, a step other
    than its folder's resumed at that step, and a file name `../x` was read outside the checkpoint; rev25: a
    part without `device`, a weight name or an optimizer type that is no string, gave `replan --checkpoint`
    one). `bad(what)`: the error that says checkpoint.json `what`."""
    step, ranks, files = manifest.get("step"), manifest.get("ranks"), manifest.get("files")
    if type(step) is not int or step < 0:
        raise bad(f"has no step count (`step`: {step!r})")
    named = CHECKPOINT_STEP_DIR.fullmatch(path.name)
    if named is not None and int(named.group(1)) != step:
        raise bad(f"says step {step}, its folder is {path.name}")
    for key in ("data", "model"):
        if not isinstance(manifest.get(key), dict):
            raise bad(f"has no `{key}` table")
    if not isinstance(ranks, list) or not ranks or not isinstance(files, dict):
        raise bad("has no `ranks` list or `files` table")
    for k, part in enumerate(ranks):
        if not (isinstance(part, dict) and part.get("rank") == k and part.get("file") == f"rank{k}.safetensors"
                and isinstance(part.get("sha256"), str) and isinstance(part.get("weights"), list)
                and all(isinstance(w, str) for w in part["weights"])
                and all(isinstance(part.get(key, 0), (str, type(None))) for key in ("device", "machine"))
                and isinstance(part.get("layout", {}), dict)
                and isinstance(part.get("optimizer"), dict)
                and isinstance(part["optimizer"].get("type"), (str, type(None)))
                and isinstance(part["optimizer"].get("param_groups"), list)
                and isinstance(part["optimizer"].get("state"), dict)):
            raise bad(f"has no part for rank {k} at place {k} of `ranks` (its file rank{k}.safetensors, sha256, "
                      "weight names, device, machine, layout and optimizer)")
    if set(files) != {f"rank{k}.json" for k in range(len(ranks))} or not all(isinstance(d, str) for d in files.values()):
        raise bad(f"`files` lists {sorted(files)[:4]}, not the hashes of rank0.json .. rank{len(ranks) - 1}.json")


__all__ = ["check_manifest_fields"]
