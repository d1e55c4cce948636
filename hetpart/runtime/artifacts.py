"""Reading an artifacts directory back: manifest and plan checks, per-rank loading.

Nothing here unpickles: JSON, safetensors and the generated `stage.py` source only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch

from hetpart.errors import HetpartError

FORMAT_VERSION = 1


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise HetpartError(f"'{path}' is missing; is '{path.parent}' a directory written by `hetpart partition`?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HetpartError(f"{path}:{err.lineno}: not valid JSON ({err.msg}); re-run `hetpart partition`") from None


def load_manifest(out: Path) -> dict[str, Any]:
    if not out.is_dir():
        raise HetpartError(f"artifacts directory '{out}' not found; create it with `hetpart partition ... --out {out}`")
    manifest = read_json(out / "manifest.json")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise HetpartError(
            f"{out / 'manifest.json'}: format version {version!r}, this hetpart reads version {FORMAT_VERSION}; "
            "re-run `hetpart partition` with this version"
        )
    _check_structure(out / "manifest.json", manifest)
    return manifest


def _check_structure(path: Path, manifest: dict[str, Any]) -> None:
    """The manifest's ranks, nodes and world size agree (it is edited by hand at times)."""
    redo = "; the manifest was edited or truncated: re-run `hetpart partition`"
    world, ranks = manifest.get("world_size"), manifest.get("ranks")
    if not isinstance(world, int) or world < 1 or not isinstance(ranks, list):
        raise HetpartError(f"{path}: needs a positive 'world_size' and a 'ranks' list{redo}")
    if len(ranks) != world:
        raise HetpartError(f"{path}: world_size is {world} but {len(ranks)} rank(s) are listed{redo}")
    needed = {"rank", "dir", "files", "inputs", "outputs", "weights", "device", "node_rank", "local_rank"}
    for k, entry in enumerate(ranks):
        if not isinstance(entry, dict) or entry.get("rank") != k or not needed <= set(entry):
            raise HetpartError(f"{path}: ranks[{k}] must be rank {k} with {', '.join(sorted(needed))}{redo}")
        if not isinstance(entry["dir"], str) or Path(entry["dir"]).is_absolute() or ".." in Path(entry["dir"]).parts:
            raise HetpartError(f"{path}: ranks[{k}].dir {entry['dir']!r} must be a directory inside {path.parent}{redo}")
    placed = [r for node in manifest.get("nodes", []) for r in node.get("ranks", [])]
    if placed != list(range(world)):
        raise HetpartError(f"{path}: the nodes hold ranks {placed}, expected 0..{world - 1} in order{redo}")


def check_rank_files(out: Path, entry: dict[str, Any]) -> Path:
    """The rank's directory, after checking every file exists and matches its sha256."""
    rank_dir = out / entry["dir"]
    if "weights.safetensors" not in entry["files"]:  # a plan traced on meta: NOTE [weight manifests]
        raise HetpartError(f"rank {entry['rank']}: {out} was partitioned without weights (--meta) and they are "
                           f"not filled yet; run `hetpart shard-weights {out} CHECKPOINT` first")
    for name, digest in entry["files"].items():
        path = rank_dir / name
        if Path(name).name != name:
            raise HetpartError(f"rank {entry['rank']}: file name {name!r} in manifest.json is not a plain name; "
                               "re-run `hetpart partition`")
        if not path.is_file():
            raise HetpartError(f"rank {entry['rank']}: '{path}' is missing; re-run `hetpart partition`")
        if _sha256(path) != digest:
            raise HetpartError(
                f"rank {entry['rank']}: '{path}' does not match its sha256 in manifest.json "
                "(modified or corrupted); re-run `hetpart partition`"
            )
    return rank_dir


def load_stage(out: Path, entry: dict[str, Any]) -> torch.nn.Module:
    """Import the rank's `stage.py` and build its `Stage` (weights loaded from beside it)."""
    rank_dir = check_rank_files(out, entry)
    name = f"hetpart_stage_{entry['rank']}"
    spec = importlib.util.spec_from_file_location(name, rank_dir / "stage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module.Stage()
