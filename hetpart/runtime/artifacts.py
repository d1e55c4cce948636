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
    return manifest


def check_rank_files(out: Path, entry: dict[str, Any]) -> Path:
    """The rank's directory, after checking every file exists and matches its sha256."""
    rank_dir = out / entry["dir"]
    for name, digest in entry["files"].items():
        path = rank_dir / name
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
