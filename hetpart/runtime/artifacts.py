"""Reading an artifacts directory back: manifest and plan checks, per-rank loading.

Nothing here unpickles: JSON, safetensors and the generated `stage.py` source only.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import operator
import sys
from pathlib import Path
from typing import Any

import torch

from hetpart.errors import HetpartError

FORMAT_VERSION = 1


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from an artifacts file; HetpartError for anything else (binary, NaN, too deep, a list)."""
    if not path.is_file():
        raise HetpartError(f"'{path}' is missing; is '{path.parent}' a directory written by `hetpart partition`?")
    try:
        data = json.loads(path.read_text(), parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise HetpartError(f"{path}:{err.lineno}: not valid JSON ({err.msg}); re-run `hetpart partition`") from None
    except (UnicodeDecodeError, RecursionError, ValueError, OSError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise HetpartError(f"{path}: not a JSON file hetpart wrote ({why}); re-run `hetpart partition`") from None
    if not isinstance(data, dict):
        raise HetpartError(f"{path}: expected a JSON object, got {type(data).__name__}; re-run `hetpart partition`")
    return data


# The fields of plan.json that `inspect` and `run` read, with their types.
_PLAN_FIELDS = {"model": dict, "cluster": dict, "stages": list, "bottleneck_us": (int, float),
                "lower_bound_us": (int, float), "gap": (int, float), "solver_status": str, "microbatches": int,
                "microbatch_size": int}
_STAGE_FIELDS = {"index": int, "device": str, "device_type": str, "node_count": int, "flops": (int, float),
                 "memory_bytes": int, "capacity_bytes": int, "compute_us": (int, float), "comm_in_us": (int, float),
                 "comm_out_us": (int, float), "predicted_time_us": (int, float)}
_SPEC_FIELDS = {"model": str, "overrides": dict, "batch_size": int, "seq_len": int, "seed": int}


def read_plan(out: Path) -> dict[str, Any]:
    """`out/plan.json`, its fields of the types `inspect` and `run` read (it is edited by hand at times)."""
    path = out / "plan.json"
    plan = read_json(path)

    def check(table: Any, fields: dict[str, Any], where: str) -> None:
        if not isinstance(table, dict):
            raise HetpartError(f"{path}: {where} must be an object; the plan was edited or truncated: "
                               "re-run `hetpart partition`")
        for key, kind in fields.items():
            if not isinstance(table.get(key), kind) or isinstance(table.get(key), bool):
                raise HetpartError(f"{path}: {where}{key!r} is missing or not a {getattr(kind, '__name__', 'number')} "
                                   f"(got {table.get(key)!r:.40}); the plan was edited or truncated: re-run "
                                   "`hetpart partition`")

    check(plan, _PLAN_FIELDS, "")
    check(plan["model"], _SPEC_FIELDS, "model.")
    if not plan["stages"]:
        raise HetpartError(f"{path}: 'stages' is empty; re-run `hetpart partition`")
    for k, stage in enumerate(plan["stages"]):
        check(stage, _STAGE_FIELDS, f"stages[{k}].")
    return plan


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
        for key, kind in _RANK_FIELDS.items():
            if not isinstance(entry[key], kind) or isinstance(entry[key], bool):
                raise HetpartError(f"{path}: ranks[{k}].{key} must be a {kind.__name__}, got {entry[key]!r:.40}{redo}")
        files, values = entry["files"], [*entry["inputs"], *entry["outputs"]]
        if not all(isinstance(n, str) and isinstance(d, str) for n, d in files.items()) or not all(
                isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("shape"), list)
                for v in values):
            raise HetpartError(f"{path}: ranks[{k}]: files must map names to sha256 strings, inputs and outputs "
                               f"list {{name, shape, dtype}}{redo}")
    nodes = manifest.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("ranks", []), list)
                                              for n in nodes):
        raise HetpartError(f"{path}: nodes must be a list of {{node_rank, machine, ranks}}{redo}")
    placed = [r for node in nodes for r in node.get("ranks", [])]
    if placed != list(range(world)):
        raise HetpartError(f"{path}: the nodes hold ranks {placed}, expected 0..{world - 1} in order{redo}")


_RANK_FIELDS = {"files": dict, "inputs": list, "outputs": list, "weights": list, "device": str, "node_rank": int,
                "local_rank": int}


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


# NOTE [symbolic dims]: the manifest writes each boundary value's shape as export traced it,
# in the model's symbols: `s0` is the batch (dim 0 of the model's inputs), `s1` the sequence
# length where it is dynamic, and a dim may be an expression of them: `16*s0` (a flattened
# [B, L, D] at a static length), `s0*s1`, `s1 - 1`, `(s1//2)`, `Max(1, s1)`. `dim_size`
# evaluates such a dim at a run's sizes. It walks the expression's Python syntax tree and
# knows integers, symbols, + - * // % ** and Max/Min, nothing else: a manifest is data, and
# sympy's parser would `eval` it.
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.Pow: operator.pow}
_CALLS = {"Max": max, "Min": min}


def dim_size(dim: object, sizes: dict[str, int]) -> int | None:
    """A manifest dim at the symbols' `sizes` (NOTE [symbolic dims]); None if it names a symbol
    `sizes` lacks. An expression that is not one of the forms above is an error."""

    def value(node: ast.AST) -> int | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            return sizes.get(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = value(node.operand)
            return None if inner is None else -inner
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = value(node.left), value(node.right)
            return None if left is None or right is None else _BINARY[type(node.op)](left, right)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
                and node.args and not node.keywords):
            args = [value(a) for a in node.args]
            return None if None in args else _CALLS[node.func.id](args)
        raise ValueError

    try:
        return value(ast.parse(str(dim).strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        raise HetpartError(f"manifest.json: cannot read the dimension {dim!r} (expected an integer or an expression "
                           "of symbols s0, s1, ... with + - * //); re-run `hetpart partition`") from None


def symbol_sizes(manifest: dict[str, Any], batch_size: int, seq_len: int) -> dict[str, int]:
    """Each symbol of the model's inputs (rank 0's) at a run's sizes: a symbol that is a dim 0 is the
    batch, one that is a later dim the sequence length (the only other dim export makes dynamic)."""
    sizes: dict[str, int] = {}
    for value in manifest["ranks"][0]["inputs"]:
        for i, dim in enumerate(value["shape"]):
            if str(dim).isidentifier():
                sizes.setdefault(str(dim), batch_size if i == 0 else seq_len)
    return sizes
