"""A rank's `stage.pt2` as a module, its weights from the rank's weights.safetensors (and an earlier
rank's, for a weight stored there: NOTE [weights stored once] in hetpart/codegen/split.py).

The .pt2 holds the program and no weights (NOTE [weightless .pt2] in hetpart/codegen/pt2.py).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch.export.pt2_archive.constants import TENSOR_CONSTANT_FILENAME_PREFIX, WEIGHT_FILENAME_PREFIX

from hetpart.codegen.pt2 import PT2_WEIGHTS
from hetpart.errors import HetpartError
from hetpart.runtime.artifacts import REDO, check_rank_files


def check_no_pickle(path: Path) -> None:
    """Refuse a .pt2 that torch.export.load would unpickle from: sample inputs (a torch.save pickle), or a
    weight or constant saved with `use_pickle` or as an object (hetpart writes none: NOTE [deterministic .pt2])."""
    try:
        with zipfile.ZipFile(path) as z:
            for record in z.infolist():
                name = record.filename
                if "/data/sample_inputs/" in name and record.file_size:
                    raise HetpartError(f"{path}: record '{name}' holds pickled sample inputs, which hetpart never "
                                       f"writes nor loads; {REDO}")
                if name.endswith(("weights_config.json", "constants_config.json")):
                    for key, payload in json.loads(z.read(name)).get("config", {}).items():
                        if payload.get("use_pickle") or not str(payload.get("path_name")).startswith(
                                (WEIGHT_FILENAME_PREFIX, TENSOR_CONSTANT_FILENAME_PREFIX)):
                            raise HetpartError(f"{path}: '{key}' is stored as a pickle, which hetpart never "
                                               f"writes nor loads; {REDO}")
    except (OSError, zipfile.BadZipFile, ValueError, AttributeError) as err:
        raise HetpartError(f"{path}: not a readable .pt2 archive ({err}); {REDO}") from None


def load_pt2(out: Path, entry: dict[str, Any]) -> torch.nn.Module:
    """Rank `entry`'s stage.pt2 as a module holding the weights of its weights.safetensors.

    Both files are checked against the manifest first (`check_rank_files`), as `run` checks them.
    """
    rank_dir = check_rank_files(out, entry)
    path = rank_dir / "stage.pt2"
    if "stage.pt2" not in entry["files"]:
        raise HetpartError(f"rank {entry['rank']}: {out} has no stage.pt2 (partitioned with --no-pt2, or with "
                           f"--meta); {REDO} without --no-pt2, or load rank<k>/stage.py")
    check_no_pickle(path)
    extra = {PT2_WEIGHTS: ""}
    program = torch.export.load(str(path), extra_files=extra)  # checked: no pickle in it
    try:
        where = json.loads(extra[PT2_WEIGHTS])
        keys, elsewhere = where["keys"], where.get("elsewhere", {})
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HetpartError(f"{path}: no readable {PT2_WEIGHTS} (written before weightless .pt2 files?); "
                           f"{REDO}") from None
    weights = load_file(str(rank_dir / "weights.safetensors"))
    for fqn, file in sorted(elsewhere.items()):  # NOTE [weights stored once]: only files the manifest hashes
        if file not in entry["files"]:
            raise HetpartError(f"{path}: reads '{fqn}' from {file}, which manifest.json does not list for rank "
                               f"{entry['rank']}; {REDO}")
        with safe_open(str(rank_dir / file), "pt") as f:
            weights[fqn] = f.get_tensor(fqn)
    missing = sorted(fqn for fqn in keys.values() if fqn not in weights)
    if missing:
        raise HetpartError(f"{rank_dir / 'weights.safetensors'}: no '{missing[0]}', which stage.pt2 reads; {REDO}")
    module = program.module()
    module.load_state_dict({key: weights[fqn] for key, fqn in keys.items()}, assign=True)
    return module
