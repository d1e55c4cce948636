"""Reading an artifacts directory back: manifest and plan checks, per-rank loading.

Nothing here unpickles: JSON, safetensors and the generated `stage.py` source only.
"""

from __future__ import annotations

import ast
import dataclasses
from dataclasses import dataclass
import json
import operator
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hetpart.errors import REDO_PARTITION, HetpartError, redo_into
from hetpart.plan_report import PlanReport, as_json, load_plan
from hetpart.runtime.stages import check_virtual_mesh, stage_entries, virtual_stages
from hetpart.trust import (
    MANIFEST_FORMAT_VERSION, MIXED_FORMAT_VERSION, SIGNATURE_NAME, NotAPlainFile, check_signature, is_sha256, is_signed,
    read_key, read_plain, sha256_bytes, sha256_file,
)

if TYPE_CHECKING:
    from hetpart.frontend import ModelSpec

FORMAT_VERSION = MANIFEST_FORMAT_VERSION
REDO = REDO_PARTITION
EDITED = f"; the manifest was edited or truncated: {REDO}"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from an artifacts file; HetpartError for anything else (binary, NaN, too deep, a list)."""
    if not path.is_file():
        raise HetpartError(f"'{path}' is missing; is '{path.parent}' a directory written by `hetpart partition`?")
    return _parse_json(path, path.read_bytes())


def _parse_json(path: Path, data: bytes) -> Any:
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise HetpartError(f"{path}:{err.lineno}: not valid JSON ({err.msg}); {REDO}") from None
    except (UnicodeDecodeError, RecursionError, ValueError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else (
            "not UTF-8" if isinstance(err, UnicodeDecodeError) else str(err))
        raise HetpartError(f"{path}: not a JSON file hetpart wrote ({why}); {REDO}") from None
    if not isinstance(value, dict):
        raise HetpartError(f"{path}: expected a JSON object, got {type(value).__name__}; {REDO}")
    return value


def load_manifest(out: Path, key: bytes | None = None, advice: str | None = None) -> dict[str, Any]:
    """manifest.json, its format version and structure checked; with `key`, its signature first
    (over the very bytes parsed: NOTE [artifacts are code] in hetpart/trust.py); `advice`: what a signature that
    does not match says to do (`check_signature`'s own where None)."""
    if not out.is_dir():
        if out.exists() or out.is_symlink():  # `inspect out/plan.json`: "not found; create it with ... --out out/plan.json"
            parent = f"; did you mean '{out.parent}'?" if (out.parent / "manifest.json").is_file() else ""
            raise HetpartError(f"'{out}' is a file, not an artifacts directory (the folder `hetpart partition --out` "
                               f"writes){parent}")
        raise HetpartError(f"artifacts directory '{out}' not found; create it with `hetpart partition ... --out {out}`")
    path = out / "manifest.json"
    try:
        data = read_plain(path)
    except NotAPlainFile as err:
        if err.reason == "missing":
            raise HetpartError(f"'{path}' is missing; is '{out}' a directory written by `hetpart partition`?"
                               ) from None
        raise HetpartError(f"'{path}' is {err.reason}; the manifest must be a plain file inside '{out}': "
                           f"{REDO}") from None
    if key is not None:
        check_signature(out, data, key) if advice is None else check_signature(out, data, key, advice)
    manifest = _parse_json(path, data)
    version = manifest.get("format_version") if isinstance(manifest, dict) else None
    if version not in (FORMAT_VERSION, MIXED_FORMAT_VERSION):  # 3: mixed TP degrees (NOTE [mixed-degree pipeline])
        raise HetpartError(
            f"{path}: format version {version!r}, this hetpart reads versions {FORMAT_VERSION} and "
            f"{MIXED_FORMAT_VERSION}: {REDO_PARTITION}, with this hetpart"
        )
    _check_structure(path, manifest)
    return manifest


def _check_files(path: Path, where: str, files: object, plain: bool) -> None:
    """A `files` table: {name: sha256}; names plain (rank files) or relative paths inside the directory."""
    if not isinstance(files, dict):
        raise HetpartError(f"{path}: {where}files must be a table of file name -> sha256{EDITED}")
    for name, digest in files.items():
        parts = Path(name).parts
        bad = Path(name).name != name if plain else (Path(name).is_absolute() or ".." in parts or not parts)
        if bad or "\\" in name:
            raise HetpartError(f"{path}: {where}files: name {name!r} is not a "
                               f"{'plain name' if plain else 'path inside the directory'}{EDITED}")
        if not is_sha256(digest):
            raise HetpartError(f"{path}: {where}files[{name!r}] is not a sha256 (64 hex digits){EDITED}")


def _check_structure(path: Path, manifest: dict[str, Any]) -> None:
    """The manifest's ranks, nodes, world size and file tables agree (it is edited by hand at times,
    and everything `run` reads is checked against it)."""
    world, ranks = manifest.get("world_size"), manifest.get("ranks")
    if not isinstance(world, int) or world < 1 or not isinstance(ranks, list):
        raise HetpartError(f"{path}: needs a positive 'world_size' and a 'ranks' list{EDITED}")
    if len(ranks) != world:
        raise HetpartError(f"{path}: world_size is {world} but {len(ranks)} rank(s) are listed{EDITED}")
    if manifest.get("backend") not in ("gloo", "nccl"):
        raise HetpartError(f"{path}: backend {manifest.get('backend')!r} must be gloo or nccl{EDITED}")
    _check_files(path, "", manifest.get("files"), plain=False)
    if "plan.json" not in manifest["files"]:
        raise HetpartError(f"{path}: files lists no sha256 for plan.json{EDITED}")
    needed = {"rank": int, "stage": int, "dir": str, "files": dict, "inputs": list, "outputs": list,
              "weights": list, "device": str, "node_rank": int, "local_rank": int}
    for where, k, entry in [(f"ranks[{k}]", k, e) for k, e in enumerate(ranks)] + [
            (f"ranks[{k}].virtual_stages[{i}]", k, e) for k, r in enumerate(ranks) if isinstance(r, dict)
            for i, e in enumerate(r.get("virtual_stages") or [])]:  # NOTE [virtual-stage manifest]
        if (not isinstance(entry, dict) or entry.get("rank") != k
                or not all(isinstance(entry.get(f), t) for f, t in needed.items())):
            fields = ", ".join(f"{f} ({t.__name__})" for f, t in needed.items())
            raise HetpartError(f"{path}: {where} must be rank {k} with {fields}{EDITED}")
        if Path(entry["dir"]).is_absolute() or ".." in Path(entry["dir"]).parts or not Path(entry["dir"]).parts:
            raise HetpartError(f"{path}: {where}.dir {entry['dir']!r} must be a directory inside {path.parent}{EDITED}")
        _check_files(path, f"{where}.", {n: d for n, d in entry["files"].items() if not _shared(n)},
                     plain=True)  # and another rank's weights it reads (NOTE [weights stored once]), below
        for side in ("inputs", "outputs"):
            for v in entry[side]:
                if not (isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("shape"), list)
                        and isinstance(v.get("dtype"), str)):
                    raise HetpartError(f"{path}: {where}.{side} must be values with a name, shape and dtype{EDITED}")
                for dim in v["shape"]:  # each readable, and cheaply so (NOTE [symbolic dims])
                    dim_size(dim, {})
        if not all(isinstance(w, str) for w in entry["weights"]):
            raise HetpartError(f"{path}: {where}.weights must be weight names{EDITED}")
    nodes = manifest.get("nodes")
    if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("ranks"), list)
                                              and isinstance(n.get("node_rank"), int) for n in nodes):
        raise HetpartError(f"{path}: needs a 'nodes' list, each with a node_rank and its ranks{EDITED}")
    placed = [r for node in nodes for r in node["ranks"]]
    if placed != list(range(world)):
        raise HetpartError(f"{path}: the nodes hold ranks {placed}, expected 0..{world - 1} in order{EDITED}")
    if virtual_stages(manifest) > 1:  # NOTE [virtual-stage manifest]
        check_virtual_mesh(path, manifest)
    else:
        _check_mesh(path, manifest["mesh"] if "mesh" in manifest else None, ranks, manifest["format_version"])
    _check_shared_files(path, stage_entries(manifest))


def _shared(name: str) -> bool:
    """A rank's file entry that names another rank's weights.safetensors (NOTE [weights stored once])."""
    return name.startswith("../") and name.endswith("/weights.safetensors")


def _check_shared_files(path: Path, ranks: list[dict[str, Any]]) -> None:
    """A rank's files that are not in its directory are an earlier rank's weights.safetensors, with that
    rank's sha256: the one copy of a weight both read (NOTE [weights stored once] in codegen/split.py).
    `ranks`: every stage's entry in directory order (`stage_entries`: a rank's, or a virtual stage's)."""
    by_dir = {entry["dir"]: (j, entry) for j, entry in enumerate(ranks)}
    for k, entry in enumerate(ranks):
        for name, digest in entry["files"].items():
            if not _shared(name):
                continue
            parts = name.split("/")
            j, other = by_dir.get(parts[1], (k, None)) if len(parts) == 3 else (k, None)
            if other is None or j >= k or other["files"].get("weights.safetensors") != digest:
                raise HetpartError(f"{path}: ranks[{k}].files: {name!r} must be an earlier rank's weights.safetensors "
                                   f"(../rank<j>/weights.safetensors) with the sha256 that rank lists{EDITED}")


@dataclass(frozen=True)
class MeshPipeline:
    """One pipeline of the mesh (NOTE [the mesh] in codegen/artifacts.py): its group, stages and batch share."""

    index: int
    group: str  # the name of its "pipeline" group
    stages: list[list[int]]  # stage -> its ranks
    microbatches: int | None  # its share of the batch; None in a plan of one pipeline (the run's --microbatches)
    microbatch_offset: int  # the first of the global batch's microbatches it runs


def mesh_pipelines(manifest: dict[str, Any]) -> list[MeshPipeline]:
    """The pipelines of a checked manifest's mesh: one, or each of several (issue 19)."""
    mesh = manifest["mesh"]
    if "pipelines" not in mesh:
        group = next(g["name"] for g in mesh["groups"] if g["kind"] == "pipeline")
        return [MeshPipeline(0, group, mesh["stages"], None, 0)]
    return [MeshPipeline(q["index"], q["group"] if "group" in q else q["lanes"][0], q["stages"], q["microbatches"],
                         q["microbatch_offset"])
            for q in mesh["pipelines"]]


def rank_pipeline(manifest: dict[str, Any], rank: int) -> MeshPipeline:
    """The pipeline that `rank` of a checked manifest runs a stage of (a TP rank: its lane's group)."""
    pipe = mesh_pipelines(manifest)[manifest["ranks"][rank].get("pipeline", 0)]
    if "tensor_parallel" in manifest["mesh"]:  # NOTE [tensor-parallel stages]
        from hetpart.runtime.tp import lane_group

        pipe = dataclasses.replace(pipe, group=lane_group(manifest, rank))
    return pipe


def _check_mesh(path: Path, mesh: Any, ranks: list[dict[str, Any]], version: int = FORMAT_VERSION) -> None:
    """The mesh (NOTE [the mesh] in codegen/artifacts.py) agrees with the ranks: every rank runs the stage
    its entry names, each pipeline group holds one rank per stage of its pipeline in stage order, and each
    rank's groups are the groups that hold it."""
    def ints(value: Any) -> bool:
        return (isinstance(value, list) and all(isinstance(r, int) and not isinstance(r, bool) for r in value)
                and value == sorted(set(value)) and all(0 <= r < len(ranks) for r in value))

    if isinstance(mesh, dict) and "tensor_parallel" in mesh:  # NOTE [tensor-parallel stages]
        from hetpart.runtime.tp import check_tp_mesh

        return check_tp_mesh(path, mesh, ranks, version)
    if version == MIXED_FORMAT_VERSION:
        raise HetpartError(f"{path}: format version {version} is a plan of mixed tensor-parallel degrees, and this "
                           f"mesh has no tensor_parallel record{EDITED}")
    several = isinstance(mesh, dict) and "pipelines" in mesh
    if not (isinstance(mesh, dict) and isinstance(mesh.get("pipelines" if several else "stages"), list)
            and isinstance(mesh.get("groups"), list) and isinstance(mesh.get("rank_groups"), list)):
        raise HetpartError(f"{path}: needs a 'mesh' with stages, groups and rank_groups{EDITED}")
    pipelines = _mesh_pipelines(path, mesh, ranks) if several else [("pipeline", mesh["stages"])]
    every = [s for _, stages in pipelines for s in stages]
    if not all(ints(s) and s for s in every) or sorted(r for s in every for r in s) != list(range(len(ranks))):
        raise HetpartError(f"{path}: mesh.stages must give each stage its ranks, every rank in one stage{EDITED}")
    for k, entry in enumerate(ranks):
        stages = pipelines[entry.get("pipeline", 0) if several else 0][1]
        if not 0 <= entry["stage"] < len(stages) or k not in stages[entry["stage"]]:
            raise HetpartError(f"{path}: ranks[{k}] runs stage {entry['stage']}, which mesh.stages does not give "
                               f"rank {k}{EDITED}")
    groups = mesh["groups"]
    names = [g.get("name") if isinstance(g, dict) else None for g in groups]
    for g in groups:
        if not (isinstance(g, dict) and isinstance(g.get("name"), str) and g.get("kind") in ("pipeline", "weights")
                and ints(g.get("ranks")) and g["ranks"] and names.count(g["name"]) == 1
                and (g["kind"] != "weights" or (isinstance(g.get("weights"), list)
                                                and all(isinstance(w, str) for w in g["weights"])))):
            raise HetpartError(f"{path}: mesh.groups must be uniquely named pipeline or weights groups of ranks "
                               f"(got {g!r:.60}){EDITED}")
    pipeline = {g["name"]: g["ranks"] for g in groups if g["kind"] == "pipeline"}
    if len(pipeline) != len(pipelines) or not all(
            name in pipeline and len(pipeline[name]) == len(stages)
            and all(r in s for r, s in zip(pipeline[name], stages)) for name, stages in pipelines):
        raise HetpartError(f"{path}: mesh.groups needs one pipeline group "
                           f"{'per pipeline ' if several else ''}holding one rank of each stage, in stage "
                           f"order{EDITED}")
    expected = [[g["name"] for g in groups if k in g["ranks"]] for k in range(len(ranks))]
    if mesh["rank_groups"] != expected:
        raise HetpartError(f"{path}: mesh.rank_groups must list the groups holding each rank ({expected}){EDITED}")


def _mesh_pipelines(path: Path, mesh: dict[str, Any], ranks: list[dict[str, Any]],
                    lanes: bool = False) -> list[tuple[str, list]]:
    """(group name, stages) of each pipeline of a mesh of several, after checking each entry and its ranks'
    pipeline, microbatches and batch rows (NOTE [the mesh] in codegen/artifacts.py); with `lanes`, pipelines of
    TP stages, each with its lanes' group names in place of one group (NOTE [tensor-parallel pipelines mesh] in
    codegen/tp.py; the group returned: its lane 0)."""
    out, offset = [], 0
    for p, q in enumerate(mesh["pipelines"] if isinstance(mesh.get("pipelines"), list) else [None]):
        named = (isinstance(q.get("lanes"), list) and q["lanes"] and all(isinstance(n, str) for n in q["lanes"])
                 and "group" not in q) if lanes and isinstance(q, dict) else isinstance(q, dict) and isinstance(
            q.get("group"), str)
        if not (isinstance(q, dict) and q.get("index") == p and named
                and isinstance(q.get("stages"), list) and q["stages"]
                and isinstance(q.get("microbatches"), int) and q["microbatches"] >= 1
                and q.get("microbatch_offset") == offset):
            raise HetpartError(f"{path}: mesh.pipelines[{p}] must be pipeline {p} with its "
                               f"{'lanes' if lanes else 'group'}, stages, microbatches (>= 1) and microbatch_offset "
                               f"{offset}{EDITED}")
        offset += q["microbatches"]
        out.append((q["lanes"][0] if lanes else q["group"], q["stages"]))
    for k, entry in enumerate(ranks):
        p = entry.get("pipeline")
        if not (isinstance(p, int) and 0 <= p < len(out)):
            raise HetpartError(f"{path}: ranks[{k}] needs its 'pipeline', one of mesh.pipelines{EDITED}")
        q = mesh["pipelines"][p]
        size = entry.get("batch_rows", [0, 0])
        if (entry.get("microbatches") != q["microbatches"] or not isinstance(size, list) or len(size) != 2
                or not all(isinstance(r, int) for r in size) or size[1] - size[0] <= 0
                or (size[1] - size[0]) % q["microbatches"]
                or size[0] != q["microbatch_offset"] * (size[1] - size[0]) // q["microbatches"]):
            raise HetpartError(f"{path}: ranks[{k}] must carry its pipeline's microbatches ({q['microbatches']}) "
                               "and batch_rows [start, stop) of whole microbatches at its offset"
                               f" {q['microbatch_offset']}{EDITED}")
    if len({(e["batch_rows"][1] - e["batch_rows"][0]) // e["microbatches"] for e in ranks}) != 1:
        raise HetpartError(f"{path}: the ranks' batch_rows give microbatches of different sizes; every pipeline "
                           f"runs microbatches of one size{EDITED}")
    return out


def _refuse(who: str, path: Path, reason: str, out: Path) -> HetpartError:
    if reason == "missing":
        return HetpartError(f"{who}'{path}' is missing; {redo_into(out)}")
    return HetpartError(f"{who}'{path}' is {reason}; the files `run` reads must be plain files inside '{out}' "
                        f"(README.md, Trust model): {REDO}")


def _mismatch(who: str, path: Path, out: Path) -> HetpartError:
    return HetpartError(f"{who}'{path}' does not match its sha256 in manifest.json (modified or corrupted); "
                        f"{redo_into(out)}")


def _inside(out: Path, path: Path) -> bool:
    """`path` lies inside `out` once every symbolic link on the way is followed."""
    return path.resolve().is_relative_to(out.resolve())


def check_file(out: Path, relative: str, digest: str, who: str = "", read: bool = False) -> bytes | None:
    """Refuse a listed file that is missing, a symbolic link (or under one leading out of `out`),
    not regular, or not matching `digest`. With `read`, return the bytes that were hashed."""
    path = out / relative
    if not _inside(out, path.parent):
        raise _refuse(who, path, f"under a directory outside '{out}'", out)
    try:
        if read:
            data = read_plain(path)
            if sha256_bytes(data) != digest:
                raise _mismatch(who, path, out)
            return data
        if sha256_file(path) != digest:
            raise _mismatch(who, path, out)
        return None
    except NotAPlainFile as err:
        raise _refuse(who, path, err.reason, out) from None


def read_listed(out: Path, manifest: dict[str, Any], relative: str) -> bytes:
    """A top-level file the manifest lists (plan.json, ir/...), checked against its sha256."""
    digest = manifest["files"].get(relative)
    if digest is None:
        raise HetpartError(f"'{out / relative}' is not listed in manifest.json; hetpart reads only the files it "
                           f"wrote: {REDO}")
    data = check_file(out, relative, digest, read=True)
    assert data is not None
    return data


def read_listed_json(out: Path, manifest: dict[str, Any], relative: str) -> dict[str, Any]:
    """A top-level JSON file the manifest lists (plan.json, ir/analysis.json, ...), checked against its sha256; a
    HetpartError unless it is a JSON object (`read_json`'s checks)."""
    return _parse_json(out / relative, read_listed(out, manifest, relative))


def read_plan(out: Path, manifest: dict[str, Any]) -> PlanReport:
    """plan.json, checked against its sha256 in the manifest, every field's type checked (NOTE [plan.json fields]),
    and its stages those the manifest runs."""
    plan = load_plan(out / "plan.json", read_listed_json(out, manifest, "plan.json"))
    _check_plan_stages(out, manifest, plan)
    return plan


def _check_plan_stages(out: Path, manifest: dict[str, Any], plan: PlanReport) -> None:
    """Every stage a manifest entry runs (its pipeline's, in a plan of several) is one of plan.json's, every stage
    of plan.json is run, and by as many virtual stages per device: an edited plan.json (its digest edited too)
    would show numbers of another plan (`export --format schedule-csv` put stage 7 of 4 devices on rank 7)."""
    several = bool(plan.pipelines) and any("pipeline" in e for e in manifest["ranks"])
    stages = [len(q.stages) for q in plan.pipelines or []] if several else [len(plan.stages)]
    ran = set()
    for e in stage_entries(manifest):
        p = e.get("pipeline", 0) if several else 0
        if not (isinstance(p, int) and 0 <= p < len(stages) and 0 <= e["stage"] < stages[p]):
            where = f"pipeline {p}'s stage" if several else "stage"
            raise HetpartError(f"{out / 'plan.json'} has no {where} {e['stage']}, which manifest.json's rank "
                               f"{e['rank']} runs: the two are of different plans; {REDO}")
        ran.add((p, e["stage"]))
    if len(ran) != sum(stages):
        raise HetpartError(f"{out / 'plan.json'} has {sum(stages)} stages, manifest.json runs {len(ran)}: the two are "
                           f"of different plans; {REDO}")
    if (plan.virtual_stages or 1) != virtual_stages(manifest):  # NOTE [virtual-stage manifest]
        raise HetpartError(f"{out / 'plan.json'} runs {plan.virtual_stages or 1} virtual stage(s) per device, "
                           f"manifest.json {virtual_stages(manifest)}: the two are of different plans; {REDO}")


def check_listed_files(out: Path, manifest: dict[str, Any]) -> None:
    """Every top-level file the manifest lists (plan.json, launch.sh, ir/...) matches its sha256."""
    for relative, digest in manifest["files"].items():
        check_file(out, relative, digest)


REQUIRED_RANK_FILES = ("stage.py",)


def check_rank_files(out: Path, entry: dict[str, Any], need_weights: bool = True) -> Path:
    """The rank's directory, after checking it: every file in it is listed, every listed file is a
    plain file that matches its sha256 (NOTE [artifacts are code] in hetpart/trust.py).

    `need_weights=False` (shard-weights) accepts a plan traced on meta whose weights are not filled yet,
    and does not check weights.safetensors at all: it is the output shard-weights replaces, and an
    interrupted commit may have left it stale, half-replaced or unlisted (NOTE [shard-weights commit]).
    """
    replaced = set() if need_weights else {"weights.safetensors", *filter(_shared, entry["files"])}
    who = f"rank {entry['rank']}: "
    rank_dir = out / entry["dir"]
    if need_weights and "weights.safetensors" not in entry["files"]:  # traced on meta: NOTE [weight manifests]
        raise HetpartError(f"rank {entry['rank']}: {out} was partitioned without weights (--meta) and they are "
                           f"not filled yet; run `hetpart shard-weights {out} CHECKPOINT` first")
    for name in REQUIRED_RANK_FILES:
        if name not in entry["files"]:
            raise HetpartError(f"{who}manifest.json lists no sha256 for {entry['dir']}/{name}; {REDO}")
    if rank_dir.is_symlink() or not _inside(out, rank_dir):
        raise _refuse(who, rank_dir, f"a symbolic link or outside '{out}'", out)
    if rank_dir.is_dir():
        known = entry["files"].keys() | replaced
        unlisted = sorted(p.name for p in rank_dir.iterdir() if p.name not in known)
        if unlisted:
            raise HetpartError(f"{who}'{rank_dir / unlisted[0]}' is not listed in manifest.json"
                               + (f" (nor {len(unlisted) - 1} more)" if len(unlisted) > 1 else "")
                               + "; `run` executes only the files hetpart wrote (README.md, Trust model): "
                               f"remove it, or {REDO}")
    for name, digest in entry["files"].items():
        if name not in replaced:
            check_file(out, f"{entry['dir']}/{name}", digest, who)
    return rank_dir


def check_before_shard(out: Path, key_path: Path | None) -> bytes | None:
    """`shard-weights` reads weights.json and constants.safetensors into weights.safetensors and rewrites
    manifest.json: check what it reads first, and a signed directory's signature, which it replaces
    (so it never signs what it did not check). The key of `--sign-key`, or None."""
    key = read_key(key_path, out) if key_path is not None else None
    signed = is_signed(out)
    if key is None and signed:
        raise HetpartError(f"'{out}' is signed ({SIGNATURE_NAME}) and shard-weights rewrites its manifest.json; "
                           "pass --sign-key KEY to check the signature and sign the result, or delete "
                           f"{out / SIGNATURE_NAME} to leave the directory unsigned")
    manifest = load_manifest(out, key if signed else None)
    check_listed_files(out, manifest)
    for entry in manifest["ranks"]:
        check_rank_files(out, entry, need_weights=False)
    return key


def load_stage(out: Path, entry: dict[str, Any]) -> torch.nn.Module:
    """Check the rank's files, execute its `stage.py` (the bytes that were hashed, not a cached .pyc)
    and build its `Stage` (weights loaded from beside it)."""
    rank_dir = check_rank_files(out, entry)
    path = rank_dir / "stage.py"
    source = check_file(out, f"{entry['dir']}/stage.py", entry["files"]["stage.py"], f"rank {entry['rank']}: ",
                        read=True)
    name = f"hetpart_stage_{entry['rank']}" + (f"_{entry['stage']}" if entry["stage"] != entry["rank"] else "")
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 (checked against the manifest)
    return module.Stage()


def model_spec_for_run(plan: PlanReport, model: str | None, trust_model_file: bool,
                       echo: Callable[[str], None] = print, command: str = "run") -> ModelSpec:
    """The model `run` may build: plan.json's spec, where a file model's file is the one the user named.

    NOTE [model files]: a file model's plan.json names a path on the partitioning machine
    and its sha256 then. `run` builds the inputs (and, with --verify, the reference) by
    importing it, so it does that only when the user names the file: `--model FILE.py:FN`
    (FN must be the plan's; the file's sha256 must be plan.json's unless
    `--trust-model-file`), or `--trust-model-file` alone (the recorded path). Only the
    file itself is compared: what it imports is the user's to trust. `replan` (`command`), which
    traces the model again to write its rank modules, takes the same two flags.
    """
    from hetpart.frontend import ModelSpec, model_file_sha256

    spec = ModelSpec.from_json(as_json(plan.model))  # its fields' types checked by load_plan
    if spec.model.startswith(("zoo:", "hf:")):
        if model is not None:
            raise HetpartError(f"--model {model}: this plan's model is {spec.model}, which hetpart builds itself; "
                               "--model is for plans of a model file (path/to/file.py:FUNCTION): leave it out")
        return spec
    recorded_path, _, fn = spec.model.rpartition(":")
    recorded = plan.model.file_sha256
    if model is None:
        if not trust_model_file:
            raise HetpartError(
                f"plan.json's model is the file '{recorded_path}' (function {fn}); `{command}` "
                + ("builds the model's inputs (and with --verify the reference)" if command == "run" else
                   "traces the model again to write the new rank modules")
                + " by importing it, and imports a model file only when you name "
                f"it: pass --model {recorded_path}:{fn} (its sha256 is compared with the one plan.json recorded "
                "at partition time), or --trust-model-file to import the recorded path as it is")
        path = Path(recorded_path)
        if not path.is_file():
            raise HetpartError(f"plan.json's model file '{path}' is not on this machine; pass --model "
                               f"FILE.py:{fn} with a copy of it")
        if model_file_sha256(spec) != recorded:
            echo(f"note: {path} changed since the plan was made (its sha256 is not plan.json's); "
                 "--trust-model-file imports it anyway")
        return spec
    path_text, sep, given_fn = model.rpartition(":")
    if not sep or not path_text or given_fn != fn:
        raise HetpartError(f"--model {model}: the plan was partitioned from function '{fn}' "
                           f"(plan.json: {spec.model}); pass --model FILE.py:{fn}")
    path = Path(path_text)
    if not path.is_file():
        raise HetpartError(f"--model {model}: '{path}' is not a file; pass the model file the plan was "
                           f"partitioned from (plan.json: {recorded_path})")
    given = dataclasses.replace(spec, model=f"{path.resolve()}:{fn}")
    if model_file_sha256(given) != recorded and not trust_model_file:
        raise HetpartError(f"--model {model}: '{path}' is not the file the plan was partitioned from (its sha256 "
                           f"differs from plan.json's); partition it again, or pass --trust-model-file to "
                           "import it anyway")
    return given


# NOTE [symbolic dims]: the manifest writes each boundary value's shape as export traced it,
# in the model's symbols: `s0` is the batch (dim 0 of the model's inputs), `s1` the sequence
# length where it is dynamic, and a dim may be an expression of them: `16*s0` (a flattened
# [B, L, D] at a static length), `s0*s1`, `s1 - 1`, `(s1//2)`, `Max(1, s1)`. `dim_size`
# evaluates such a dim at a run's sizes. It walks the expression's Python syntax tree and
# knows integers, symbols, + - * // % ** and Max/Min, nothing else: a manifest is data, and
# sympy's parser would `eval` it. Nor may data cost time or memory: `**` only with a literal
# exponent of 0..MAX_DIM_POWER (`s1**2`, a flattened [B, L, L]), so "9**9**9**9", which would
# compute for ever, is refused; a dim is at most MAX_DIM_TEXT characters, every value along
# the way at most MAX_DIM_STEP in size and the result an int in 0..MAX_DIM. `load_manifest`
# reads every dim so (symbols unknown), so a manifest with another one is refused before
# torchrun starts.
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}
_CALLS = {"Max": max, "Min": min}
MAX_DIM = 2**40  # elements along one dim: far above any tensor's
MAX_DIM_STEP = 2**62  # |a value| inside a dim's expression
MAX_DIM_TEXT = 200  # characters of one dim
MAX_DIM_POWER = 4  # the largest exponent of a `**`


def dim_size(dim: object, sizes: dict[str, int]) -> int | None:
    """A manifest dim at the symbols' `sizes` (NOTE [symbolic dims]); None if it names a symbol
    `sizes` lacks. An expression that is not one of the forms above is an error."""

    def value(node: ast.AST) -> int | None:
        result = step(node)
        if result is not None and abs(result) > MAX_DIM_STEP:
            raise ValueError
        return result

    def step(node: ast.AST) -> int | None:
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
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant)
                and type(node.right.value) is int and 0 <= node.right.value <= MAX_DIM_POWER):
            base = value(node.left)
            return None if base is None else base ** node.right.value
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS
                and node.args and not node.keywords):
            args = [value(a) for a in node.args]
            return None if None in args else _CALLS[node.func.id](args)
        raise ValueError

    text = str(dim).strip()
    try:
        if len(text) > MAX_DIM_TEXT:
            raise ValueError
        size = value(ast.parse(text, mode="eval").body)
        if size is not None and not 0 <= size <= MAX_DIM:
            raise ValueError
        return size
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        shown = repr(dim) if len(repr(dim)) <= 80 else repr(dim)[:77] + "..."
        raise HetpartError(f"manifest.json: cannot read the dimension {shown} (expected an integer in 0..2**40 or an "
                           f"expression of symbols s0, s1, ... with + - * // % Max Min); {REDO}") from None


def symbol_sizes(manifest: dict[str, Any], batch_size: int, seq_len: int) -> dict[str, int]:
    """Each symbol of the model's inputs (rank 0's) at a run's sizes: a symbol that is a dim 0 is the
    batch, one that is a later dim the sequence length (the only other dim export makes dynamic)."""
    sizes: dict[str, int] = {}
    for value in manifest["ranks"][0]["inputs"]:
        for i, dim in enumerate(value["shape"]):
            if str(dim).isidentifier():
                sizes.setdefault(str(dim), batch_size if i == 0 else seq_len)
    return sizes
