"""The artifacts directory: per-rank stage source and weights, plan.json, manifest.json.

    out/
      plan.json                 stages, devices, predicted times, bound, gap, model spec
      manifest.json             per rank: files + sha256, inputs/outputs, device, backend
      rank<k>/stage.py          standalone nn.Module source (torch + safetensors only)
      rank<k>/weights.safetensors
      ir/                       numbered pass dumps and graph.json
      timings.json              run-specific numbers (pass and solver seconds)

Everything but timings.json is deterministic for the same inputs. The directory
is built beside the target and renamed into place, so an interrupted run leaves
no partial directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hetpart.codegen.source import stage_source
from hetpart.codegen.split import StageGraph
from hetpart.errors import HetpartError
from hetpart.ir import info

FORMAT_VERSION = 1


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


@contextlib.contextmanager
def staging_dir(out: Path, force: bool) -> Iterator[Path]:
    """A fresh directory beside `out`, renamed to `out` only if the block succeeds."""
    out = out.resolve()
    if out.exists() and not force:
        raise HetpartError(f"output directory '{out}' already exists; pass --force to replace it")
    if out.exists() and not out.is_dir():
        raise HetpartError(f"output path '{out}' exists and is not a directory")
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=parent))
    except OSError as err:
        raise HetpartError(f"cannot create the output directory in '{parent}': {err.strerror}") from None
    try:
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.replace(out, old / "x")
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _boundary(stage: StageGraph) -> tuple[list[dict], list[dict]]:
    """Name, symbolic shape and dtype of each input and output of a stage, in order."""
    graph = stage.gm.graph
    placeholders = graph.find_nodes(op="placeholder")
    returned = graph.find_nodes(op="output")[0].args[0]

    def describe(node, name: str) -> dict:
        return {"name": name, "shape": list(info(node).shape or ()), "dtype": info(node).dtype}

    return ([describe(n, name) for n, name in zip(placeholders, stage.inputs)],
            [describe(n, name) for n, name in zip(returned, stage.outputs)])


def write_rank(rank_dir: Path, stage: StageGraph, header: str) -> dict[str, str]:
    """stage.py and weights.safetensors for one rank; returns {file: sha256}."""
    rank_dir.mkdir(parents=True)
    params = {name for name, _ in stage.gm.named_parameters()}
    (rank_dir / "stage.py").write_text(stage_source(stage, header, params))
    tensors: dict[str, torch.Tensor] = {}
    for attr, fqn in stage.weights.items():
        tensors[fqn] = getattr(stage.gm, attr).detach().contiguous()
    save_file(tensors, str(rank_dir / "weights.safetensors"), metadata={"format": "pt"})
    return {f: sha256(rank_dir / f) for f in ("stage.py", "weights.safetensors")}


def manifest(stages: list[StageGraph], files: list[dict[str, str]], planned_devices: list[str]) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "world_size": len(stages),
        "backend": "gloo",
        "ranks": [
            {
                "rank": s.index,
                "stage": s.index,
                "device": "cpu",
                "planned_device": planned_devices[s.index],
                "dir": f"rank{s.index}",
                "files": files[s.index],
                "inputs": _boundary(s)[0],
                "outputs": _boundary(s)[1],
                "weights": sorted(s.weights.values()),
            }
            for s in stages
        ],
    }
