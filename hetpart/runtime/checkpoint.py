"""Per-rank training checkpoints: `hetpart run --checkpoint-every K --checkpoint-dir CK` and `--resume CK`.

NOTE [checkpoint layout]
A checkpoint of step N is the folder CK/step-<N, 6 digits>/ holding
    rank<k>.safetensors  rank k's weights ("weight/<fqn>") and optimizer state tensors
                         ("optimizer/<fqn>/<key>", e.g. SGD's momentum_buffer): no pickle
    rank<k>.json         rank k's part of the manifest (its file's sha256, weights, device,
                         the optimizer's param_groups and its non-tensor state, as JSON)
    checkpoint.json      the manifest: format, step, data position, the plan's model, and every
                         rank's part; written last
Each rank writes its two files into CK/.step-<N>.<token>.partial/ (a fresh temp, fsync, rename:
`_write_durable`), all ranks meet at a barrier, then rank 0 writes checkpoint.json there and renames
the folder to step-<N> (then fsyncs CK). A checkpoint is complete iff its folder has that name and
checkpoint.json: a crash at any point leaves at most a `.partial` folder, never taken as a checkpoint
(and left in place: it may be inspected; hetpart never deletes what it did not list).
The data position is the step: `run --mode training` trains every step on the same example batch
(built from the plan's model spec and seed at the run's --batch-size and --seq-len), so a resumed run
must use the same batch, length and seed (`check_resume`), and continues at step N + 1.
`--keep-checkpoints N` removes this run's older complete checkpoints (checkpoint.json's `run` is this run's
token; only the files their checkpoint.json lists, then the folder if it is empty): never another run's, not
even the one it resumed from, nor one of a newer step. Resume (`--resume CK` or CK/step-<N>) checks every file's
sha256 before anything runs (`read_checkpoint`); each new rank then reads only the tensors it holds, lazily with
safetensors' `safe_open`, from the old rank on its own device where there was one, else a surviving one (on a
device of the new plan) on its machine, else any surviving one, else the lost ones' parts (the checkpoint's), as
the re-plan counts its bytes (`weight_sources`), and checks the hash of each file it opens.
A rank of a tensor-parallel stage writes its shards; rank<k>.json's `layout` says, per tensor, the full shape and
which slices of it the rank holds, and a new rank reads only the slices of its own part (NOTE [checkpoint slices] in
checkpoint_slices.py). A rank of several stages (virtual stages) writes and reads all of its stages' tensors (their
FQNs are distinct; a weight two of them hold is written once).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hetpart.errors import HetpartError
from hetpart.runtime.checkpoint_manifest import check_manifest_fields
from hetpart.runtime.checkpoint_slices import Layout, SliceRead, assemble, needed_layout, plan_reads, saved_layouts
from hetpart.runtime.stages import rank_stage_entries
from hetpart.fsio import (CHECKPOINT_FORMAT, CHECKPOINT_MANIFEST, CHECKPOINT_PARTIAL_DIR, CHECKPOINT_STEP_DIR,
                          AtomicWrites, check_outside_artifacts, real_dir)
from hetpart.trust import NotAPlainFile, sha256_bytes, sha256_file

FORMAT = CHECKPOINT_FORMAT
FORMAT_VERSION = 2  # 2: rank<k>.json's `layout` (NOTE [checkpoint slices]); 1 (every tensor whole) is read too
READS = (1, 2)
MANIFEST = CHECKPOINT_MANIFEST
STEP_DIR = CHECKPOINT_STEP_DIR


def step_dir_name(step: int) -> str:
    """The folder of the checkpoint after `step` steps (NOTE [checkpoint layout])."""
    return f"step-{step:06d}"


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint, read back and every file's hash checked."""

    path: Path  # CK/step-<N>
    step: int  # steps trained before it was written
    data: dict[str, Any]  # the data position: batch_size, seq_len, seed, microbatches, samples_seen
    model: dict[str, Any]  # plan.json's model record of the run that wrote it
    ranks: list[dict[str, Any]]  # each old rank's part (rank<k>.json)

    def holders(self) -> dict[str, list[dict[str, Any]]]:
        """weight FQN -> the old ranks' parts that hold it, in rank order."""
        out: dict[str, list[dict[str, Any]]] = {}
        for part in self.ranks:
            for name in part["weights"]:
                out.setdefault(name, []).append(part)
        return out


# --- Writing (the ranks).

def _write_durable(path: Path, data: bytes) -> str:
    """Write `path` through a fresh temp, fsync and rename (NOTE [safe writes] in fsio.py); its sha256."""
    with AtomicWrites() as w:
        with w.open(path) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return sha256_bytes(data)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rank_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer | None, names: dict[str, str],
               params: list[torch.nn.Parameter]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """This rank's tensors (weights by FQN, optimizer state tensors) and the optimizer's JSON part:
    its real state_dict, each parameter index replaced by the weight's FQN."""
    state = module.state_dict()
    tensors = {f"weight/{names[attr]}": t.detach().cpu().contiguous() for attr, t in state.items() if attr in names}
    fqn_of = {id(p): names[attr] for attr, p in module.named_parameters() if attr in names}
    index_fqn = [fqn_of.get(id(p)) for p in params]
    opt: dict[str, Any] = {"type": None, "param_groups": [], "state": {}}
    if optimizer is not None:
        sd = optimizer.state_dict()
        opt["type"] = type(optimizer).__name__
        for group in sd["param_groups"]:
            opt["param_groups"].append({**{k: v for k, v in group.items() if k != "params"},
                                        "params": [index_fqn[i] for i in group["params"]]})
        for index, entries in sd["state"].items():
            fqn = index_fqn[index]
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    tensors[f"optimizer/{fqn}/{key}"] = value.detach().cpu().contiguous()
                else:
                    opt["state"].setdefault(fqn, {})[key] = value  # None or a number: JSON
    return tensors, opt


def save_rank(ck: Path, step: int, token: str, rank: int, entry: dict[str, Any], tensors: dict[str, torch.Tensor],
              optimizer: dict[str, Any], shards: dict[str, dict[str, int]] | None = None) -> None:
    """Rank `rank`'s two files of the checkpoint of `step`, in the partial folder (NOTE [checkpoint layout]);
    `shards`: its split weights (runtime/tp.py `weight_shards`), recorded in each tensor's layout."""
    from safetensors.torch import save

    layouts = saved_layouts(tensors, shards or {})
    partial = ck / f".{step_dir_name(step)}.{token}.partial"
    partial.mkdir(exist_ok=True)
    data = save(tensors)
    digest = _write_durable(partial / f"rank{rank}.safetensors", data)
    part = {"rank": rank, "file": f"rank{rank}.safetensors", "sha256": digest, "bytes": len(data),
            "device": entry.get("planned_device"), "machine": entry.get("machine"),
            "weights": sorted(k.split("/", 1)[1] for k in tensors if k.startswith("weight/")),
            "optimizer": optimizer, "layout": {k: v.to_json() for k, v in sorted(layouts.items())}}
    _write_durable(partial / f"rank{rank}.json", json.dumps(part, indent=1, sort_keys=True).encode())


def finish_checkpoint(ck: Path, step: int, token: str, world: int, data: dict[str, Any], model: dict[str, Any],
                      keep: int | None) -> Path:
    """Rank 0, after every rank saved: checkpoint.json, then the rename that makes it complete; prune to `keep`."""
    partial = ck / f".{step_dir_name(step)}.{token}.partial"
    ranks = [json.loads((partial / f"rank{r}.json").read_text()) for r in range(world)]
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step, "run": token, "data": data,
                "model": model, "ranks": ranks,
                "files": {f"rank{r}.json": sha256_file(partial / f"rank{r}.json") for r in range(world)}}
    _write_durable(partial / MANIFEST, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    _fsync_dir(partial)
    final = ck / step_dir_name(step)
    os.rename(partial, final)  # refuses a non-empty folder already there (checked before the run too)
    _fsync_dir(ck)
    if keep is not None:
        prune(ck, keep, token)
    return final


def manifest_of(path: Path) -> dict[str, Any] | None:
    """The checkpoint manifest at `path`, or None if it is not a readable hetpart one."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


def prune(ck: Path, keep: int, run: str) -> list[Path]:
    """Remove all but the `keep` newest complete checkpoints that the run `run` (its token) wrote in `ck`: the
    files each one's checkpoint.json lists and the manifest, then its folder if nothing else is left in it.
    Another run's checkpoints are never touched (NOTE [checkpoint layout])."""
    removed = []
    own = [(path, m) for path in complete_checkpoints(ck) if (m := manifest_of(path)) is not None and m.get("run") == run]
    for path, manifest in own[:-keep] if keep > 0 else []:
        for part in manifest.get("ranks", []):
            for name in (part.get("file"), f"rank{part.get('rank')}.json"):
                if isinstance(name, str) and "/" not in name and name not in ("", ".", ".."):
                    (path / name).unlink(missing_ok=True)
        (path / MANIFEST).unlink(missing_ok=True)
        if not any(path.iterdir()):
            path.rmdir()
        removed.append(path)
    return removed


# --- Reading (the launcher and the ranks).

def complete_checkpoints(ck: Path) -> list[Path]:
    """The complete checkpoints in `ck` (step-<N> folders with a checkpoint.json), oldest first."""
    if not ck.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ck.iterdir()
             if (m := STEP_DIR.fullmatch(p.name)) and p.is_dir() and not p.is_symlink() and (p / MANIFEST).is_file()]
    return [p for _, p in sorted(found)]


def find_checkpoint(path: Path) -> Path:
    """`--resume PATH`: a checkpoint folder (never a .partial one: NOTE [checkpoint layout]), or a checkpoint dir
    whose newest complete checkpoint is taken."""
    if CHECKPOINT_PARTIAL_DIR.fullmatch(path.resolve().name):
        raise HetpartError(f"--resume {path}: a checkpoint a run did not finish writing (a .partial folder, never "
                           "taken as one); pass the --checkpoint-dir that holds it, or one of its step-<N> folders")
    if (path / MANIFEST).is_file():
        return path
    if not path.is_dir():
        raise HetpartError(f"--resume {path}: {'not a' if path.exists() else 'no such'} directory; pass the "
                           "--checkpoint-dir of a training run (or one of its step-<N> folders)")
    found = complete_checkpoints(path)
    if not found:
        raise HetpartError(f"--resume {path}: no complete checkpoint there (a step-<N> folder with {MANIFEST}); "
                           "a .partial folder is a checkpoint a run did not finish writing")
    return found[-1]


def _tampered(path: Path, what: str) -> HetpartError:
    return HetpartError(f"checkpoint '{path.parent}': {what}; it was changed or truncated after hetpart wrote it: "
                        "resume from another checkpoint (the --checkpoint-dir's other step-<N> folders)")


def check_file_hash(path: Path, digest: str) -> None:
    """An error unless `path` is a plain file whose sha256 is `digest`."""
    try:
        got = sha256_file(path)
    except NotAPlainFile as err:
        raise _tampered(path, f"'{path.name}' is {err.reason}") from None
    if got != digest:
        raise _tampered(path, f"'{path.name}' has sha256 {got[:12]}..., {MANIFEST} says {digest[:12]}...")


def read_checkpoint(path: Path, check_tensors: bool = True) -> Checkpoint:
    """The checkpoint at `path` (a step-<N> folder), its manifest and every listed file's sha256 checked."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise _tampered(path / MANIFEST, f"{MANIFEST} cannot be read ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise HetpartError(f"'{path / MANIFEST}' is not a hetpart checkpoint manifest")
    if manifest.get("format_version") not in READS:
        raise HetpartError(f"'{path / MANIFEST}': checkpoint format {manifest.get('format_version')}, this hetpart "
                           f"reads {', '.join(map(str, READS))}")
    check_manifest_fields(path, manifest, lambda what: _tampered(path / MANIFEST, f"{MANIFEST} {what}"))
    for name, digest in manifest["files"].items():
        check_file_hash(path / name, digest)
    ranks = manifest["ranks"]
    for part in ranks:
        if part != json.loads((path / f"rank{part['rank']}.json").read_text()):
            raise _tampered(path / f"rank{part['rank']}.json", f"rank {part['rank']}'s part differs from {MANIFEST}")
        if check_tensors:
            check_file_hash(path / part["file"], part["sha256"])
    return Checkpoint(path, manifest["step"], manifest["data"], manifest["model"], ranks)


def weight_sources(ckpt: Checkpoint, entry: dict[str, Any], weights: list[str],
                   alive: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """Which old rank's file each of a new rank's `weights` is read from first: the old rank on the new rank's
    planned device, else a surviving one (a device of the new plan, `alive`) on its machine, else any surviving
    one, else one on its machine, else the first that held it (NOTE [checkpoint layout])."""
    return {w: parts[0] for w, parts in ranked_holders(ckpt, entry, weights, alive).items()}


def ranked_holders(ckpt: Checkpoint, entry: dict[str, Any], weights: list[str],
                   alive: Collection[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """Each of a new rank's `weights` -> the old ranks' parts holding it, in the order `weight_sources` prefers."""
    holders = ckpt.holders()
    missing = [w for w in weights if w not in holders]
    if missing:
        raise HetpartError(f"checkpoint '{ckpt.path}' holds no weight {missing[:3]} that rank {entry['rank']} needs: "
                           "is it a checkpoint of this model?")

    def rank_of(part: dict[str, Any]) -> tuple[bool, bool, bool]:
        return (part["device"] != entry.get("planned_device"), part["device"] not in alive,
                part["machine"] != entry.get("machine"))

    return {w: sorted(holders[w], key=rank_of) for w in weights}


def part_layouts(ckpt: Checkpoint, part: dict[str, Any]) -> dict[str, Layout]:
    """Tensor name -> its layout in an old rank's file (NOTE [checkpoint slices]); a format-1 part (no
    `layout`) holds every tensor whole: their shapes from its file's header."""
    where = f"checkpoint '{ckpt.path}', {part['file']}"
    if "layout" in part:
        raw = part["layout"]
        if not isinstance(raw, dict):
            raise HetpartError(f"{where}: `layout` is not a table; the checkpoint was edited: resume from another one")
        return {k: Layout.from_json(v, f"{where}, {k}") for k, v in raw.items()}
    from safetensors import safe_open

    with safe_open(str(ckpt.path / part["file"]), framework="pt") as f:
        return {k: Layout(tuple(f.get_slice(k).get_shape())) for k in f.keys()}


def rank_reads(ckpt: Checkpoint, entry: dict[str, Any], weights: list[str], shards: dict[str, dict[str, int]],
               alive: Collection[str] = ()) -> dict[str, tuple[Layout, list[SliceRead]]]:
    """A new rank's tensors ("weight/<fqn>" and the optimizer state of each of its `weights`) -> what it needs of
    each (its shard under `shards`, or all) and the old slices that make it (NOTE [checkpoint slices])."""
    layouts: dict[str, dict[str, Layout]] = {}
    out = {}
    for fqn, parts in ranked_holders(ckpt, entry, weights, alive).items():
        for part in parts:
            if part["file"] not in layouts:
                layouts[part["file"]] = part_layouts(ckpt, part)
        held = [layouts[p["file"]] for p in parts]
        keys = {k for h in held for k in h if k == f"weight/{fqn}" or k.startswith(f"optimizer/{fqn}/")}
        weight = next((h[f"weight/{fqn}"] for h in held if f"weight/{fqn}" in h), None)
        if weight is None:
            raise HetpartError(f"--resume {ckpt.path}: its parts list {fqn} but hold no tensor weight/{fqn}; the "
                               "checkpoint was edited: resume from another one")
        for key in sorted(keys):
            holders = [(p["file"], layouts[p["file"]][key]) for p in parts if key in layouts[p["file"]]]
            need = needed_layout(key, holders[0][1], shards, weight.shape)
            try:
                out[key] = (need, plan_reads(key, need, holders))
            except HetpartError as err:
                raise HetpartError(f"--resume {ckpt.path}: rank {entry['rank']}: {err}") from None
    return out


def rank_weights(entry: dict[str, Any]) -> list[str]:
    """The weights of every stage a rank runs (several: virtual stages)."""
    return sorted({w for e in rank_stage_entries(entry) for w in e["weights"]})


def check_resume(ckpt: Checkpoint, model: dict[str, Any], data: dict[str, Any]) -> None:
    """An error unless this run continues `ckpt`: the same model (spec and seed), and the same batch and length."""
    if ckpt.model != model:
        raise HetpartError(f"--resume {ckpt.path}: it is a checkpoint of {ckpt.model.get('model')} "
                           f"{ckpt.model.get('overrides')} (seed {ckpt.model.get('seed')}), the plan is of "
                           f"{model.get('model')} {model.get('overrides')} (seed {model.get('seed')}): resume with a "
                           "plan of the same model (`hetpart replan` of the run that wrote it)")
    for key in ("batch_size", "seq_len", "seed"):
        if ckpt.data.get(key) != data.get(key):
            flag = "--" + key.replace("_", "-")
            raise HetpartError(f"--resume {ckpt.path}: the checkpoint's data position is at {key} "
                               f"{ckpt.data.get(key)}, this run's is {data.get(key)}: run with {flag} "
                               f"{ckpt.data.get(key)} to continue it (NOTE [checkpoint layout])")


def load_rank(ckpt: Checkpoint, entry: dict[str, Any], module: torch.nn.Module,
              optimizer: torch.optim.Optimizer | None, names: dict[str, str],
              params: list[torch.nn.Parameter], shards: dict[str, dict[str, int]] | None = None,
              alive: Collection[str] = ()) -> None:
    """Give this rank's module and optimizer their tensors from `ckpt`: only the slices of its part (`shards`: its
    split weights, NOTE [checkpoint slices]), read lazily (`safe_open`) from the files `weight_sources` prefers,
    each file's hash checked first."""
    from safetensors import safe_open

    state = module.state_dict()
    attrs: dict[str, list[str]] = {}
    for attr in state:
        if attr in names:
            attrs.setdefault(names[attr], []).append(attr)
    reads = rank_reads(ckpt, entry, sorted(attrs), shards or {}, alive)
    sources = weight_sources(ckpt, entry, sorted(attrs), alive)
    loaded: dict[str, torch.Tensor] = {}
    with contextlib.ExitStack() as stack:
        handles = {}
        for file in sorted({r.file for _, rs in reads.values() for r in rs}):
            part = next(p for p in ckpt.ranks if p["file"] == file)
            check_file_hash(ckpt.path / file, part["sha256"])
            handles[file] = stack.enter_context(safe_open(str(ckpt.path / file), framework="pt"))
        for key, (need, rs) in reads.items():
            loaded[key] = assemble(need, rs, lambda file, key=key: handles[file].get_slice(key))
    opt_tensors: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in loaded.items():
        if key.startswith("optimizer/"):
            fqn, name = key.split("/", 1)[1].rsplit("/", 1)
            opt_tensors.setdefault(fqn, {})[name] = tensor
    with torch.no_grad():
        for fqn, held in attrs.items():
            tensor = loaded[f"weight/{fqn}"]
            for attr in held:
                target = state[attr]
                if target.shape != tensor.shape:
                    raise HetpartError(f"checkpoint '{ckpt.path}': weight {fqn} is {list(tensor.shape)} in this "
                                       f"rank's part, rank {entry['rank']}'s is {list(target.shape)}: a checkpoint "
                                       "of another model")
                target.copy_(tensor)
    if optimizer is not None:
        optimizer.load_state_dict(_optimizer_state(ckpt, sources, opt_tensors, module, names, params, optimizer))


def _optimizer_state(ckpt: Checkpoint, sources: dict[str, dict[str, Any]], tensors: dict[str, dict[str, torch.Tensor]],
                     module: torch.nn.Module, names: dict[str, str], params: list[torch.nn.Parameter],
                     optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's optimizer state_dict rebuilt from the old ranks' parts: one param group with the
    checkpoint's hyperparameters (every old rank's must agree), each parameter's state by its FQN."""
    kinds = {p["optimizer"]["type"] for p in ckpt.ranks if p["optimizer"]["type"] is not None}
    if kinds and kinds != {type(optimizer).__name__}:
        raise HetpartError(f"checkpoint '{ckpt.path}' holds {sorted(kinds)} state, this run steps "
                           f"{type(optimizer).__name__}")
    hyper = {json.dumps({k: v for k, v in g.items() if k != "params"}, sort_keys=True)
             for p in ckpt.ranks for g in p["optimizer"]["param_groups"]}
    if len(hyper) > 1:
        raise HetpartError(f"checkpoint '{ckpt.path}': its ranks' optimizers have different hyperparameters "
                           f"({sorted(hyper)}); hetpart resumes one param group")
    group = json.loads(hyper.pop()) if hyper else dict(optimizer.state_dict()["param_groups"][0])
    group.pop("params", None)
    fqn_of = {id(p): names[attr] for attr, p in module.named_parameters() if attr in names}
    state: dict[int, dict[str, Any]] = {}
    for index, p in enumerate(params):
        fqn = fqn_of.get(id(p))
        entries = {**sources[fqn]["optimizer"]["state"].get(fqn, {}), **tensors.get(fqn, {})} if fqn in sources else {}
        if entries:
            state[index] = entries
    return {"state": state, "param_groups": [{**group, "params": list(range(len(params)))}]}


def check_checkpoint_dir(ck: Path, first_step: int, steps: int, every: int) -> list[int]:
    """Before a run: `ck` is a real folder, or one that can be made (`make_checkpoint_dir`, once every check of the
    run passed: a run refused leaves no folder behind, review23), and holds no checkpoint this run would write;
    the steps it will write."""
    planned = [s for s in range(first_step + 1, first_step + steps + 1) if s % every == 0]
    if ck.exists() or ck.is_symlink():
        real_dir(ck, "checkpoints", "pass another --checkpoint-dir")
    else:
        parent = next(p for p in Path(os.path.abspath(ck)).parents if p.exists() or p.is_symlink())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise HetpartError(f"--checkpoint-dir {ck}: cannot create it ('{parent}' is not a folder you may write "
                               "in): pass another --checkpoint-dir")
    taken = [s for s in planned if os.path.lexists(ck / step_dir_name(s))]  # a dangling link too (review23)
    if taken:
        raise HetpartError(f"--checkpoint-dir {ck} already holds {step_dir_name(taken[0])}, which this run would "
                           "write: pass another --checkpoint-dir (hetpart never replaces a checkpoint)")
    return planned


def make_checkpoint_dir(run: CheckpointRun | None) -> None:
    """The launcher, once every check passed and just before the ranks start: the --checkpoint-dir, if missing."""
    if run is not None and run.save_dir is not None and not run.save_dir.is_dir():
        try:
            run.save_dir.mkdir(parents=True)
        except OSError as err:
            raise HetpartError(f"--checkpoint-dir {run.save_dir}: cannot create it ({err.strerror})") from None


# --- The worker's hooks (`run_rank` in worker.py).

@dataclass(frozen=True)
class CheckpointRun:
    """What one rank saves and resumes from; passed by the launcher as the worker's --checkpoint JSON."""

    save_dir: Path | None = None  # --checkpoint-dir
    every: int = 0  # --checkpoint-every (0: never)
    keep: int | None = None  # --keep-checkpoints
    token: str = ""  # this run's partial folders' name part (NOTE [checkpoint layout])
    data: dict | None = None  # batch_size, seq_len, seed, microbatches: the data position without the step
    model: dict | None = None  # plan.json's model record
    resume: Path | None = None  # a checkpoint folder to start from
    first_step: int = 0  # the steps trained before this run (the resumed checkpoint's step)
    alive: tuple[str, ...] = ()  # the new plan's devices: an old rank on one survived (its files read first)

    def to_json(self) -> str:
        return json.dumps({**self.__dict__, "save_dir": str(self.save_dir) if self.save_dir else None,
                           "resume": str(self.resume) if self.resume else None})

    @staticmethod
    def from_json(text: str) -> CheckpointRun:
        raw = json.loads(text)
        return CheckpointRun(**{**raw, "save_dir": Path(raw["save_dir"]) if raw["save_dir"] else None,
                                "resume": Path(raw["resume"]) if raw["resume"] else None})

    def before_loop(self, entry: dict[str, Any], module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    names: dict[str, str], params: list[torch.nn.Parameter],
                    shards: dict[str, dict[str, int]] | None = None) -> None:
        """With --resume: load this rank's weights and optimizer state (`shards`: its split weights'
        parts) from the checkpoint."""
        if self.resume is not None:
            load_rank(read_checkpoint(self.resume, check_tensors=False), entry, module, optimizer, names, params,
                      shards, self.alive)
            print(f"rank {entry['rank']}: resumed from {self.resume} (step {self.first_step})", flush=True)

    def after_step(self, step: int, entry: dict[str, Any], module: torch.nn.Module,
                   optimizer: torch.optim.Optimizer | None, names: dict[str, str],
                   params: list[torch.nn.Parameter], shards: dict[str, dict[str, int]] | None = None) -> None:
        """After the optimizer step of this run's `step` (0-based): every rank saves where the global step is a
        multiple of `every`; rank 0 completes the checkpoint once all have (NOTE [checkpoint layout])."""
        import torch.distributed as dist

        done = self.first_step + step + 1
        if self.save_dir is None or not self.every or done % self.every:
            return
        tensors, opt = rank_state(module, optimizer, names, params)
        save_rank(self.save_dir, done, self.token, entry["rank"], entry, tensors, opt, shards)
        dist.barrier()
        if dist.get_rank() == 0:
            data = {**(self.data or {}), "samples_seen": done * (self.data or {}).get("batch_size", 0)}
            final = finish_checkpoint(self.save_dir, done, self.token, dist.get_world_size(), data, self.model or {},
                                      self.keep)
            print(f"rank 0: checkpoint of step {done} in {final}", flush=True)
        dist.barrier()


# --- The launcher's side (`run_pipeline` in launch.py).

@dataclass(frozen=True)
class CheckpointFlags:
    """`hetpart run`'s checkpoint flags (RunOptions.checkpoints)."""

    dir: Path | None = None  # --checkpoint-dir
    every: int | None = None  # --checkpoint-every
    keep: int | None = None  # --keep-checkpoints
    resume: Path | None = None  # --resume: a --checkpoint-dir (its newest complete checkpoint) or a step-<N> folder


def model_record(plan_model: dict[str, Any]) -> dict[str, Any]:
    """What must be equal for a run to continue a checkpoint: the model, its overrides, seed and file (the
    traced sizes may differ: the data position has the run's)."""
    return {k: v for k, v in plan_model.items() if k not in ("batch_size", "seq_len")}


def prepare_run(manifest: dict[str, Any], plan_model: dict[str, Any], data: dict[str, Any], steps: int, *,
                mode: str, checkpoint_dir: Path | None, every: int | None, keep: int | None,
                resume: Path | None) -> CheckpointRun | None:
    """The ranks' CheckpointRun, every flag and file checked before anything runs; None without checkpoint flags."""
    if checkpoint_dir is None and resume is None and every is None and keep is None:
        return None
    if mode != "training":
        raise HetpartError("--checkpoint-dir, --checkpoint-every and --resume need --mode training "
                           "(an inference run has no state to save)")
    if (checkpoint_dir is None) != (every is None):
        raise HetpartError("--checkpoint-every K and --checkpoint-dir CK go together: pass both (or neither)")
    if keep is not None and checkpoint_dir is None:
        raise HetpartError("--keep-checkpoints needs --checkpoint-dir and --checkpoint-every")
    if every is not None and every < 1 or keep is not None and keep < 1:
        raise HetpartError("--checkpoint-every and --keep-checkpoints must be >= 1")
    model = model_record(plan_model)
    first, path = 0, None
    alive = tuple(sorted({e["planned_device"] for e in manifest["ranks"] if e.get("planned_device")}))
    if resume is not None:
        ckpt = read_checkpoint(find_checkpoint(resume))
        check_resume(ckpt, model, data)
        from hetpart.runtime.tp import weight_shards

        for entry in manifest["ranks"]:  # every slice of every rank's tensors is in it
            rank_reads(ckpt, entry, rank_weights(entry), weight_shards(manifest, entry), alive)
        first, path = ckpt.step, ckpt.path.resolve()
    if checkpoint_dir is not None:
        check_checkpoint_dir(checkpoint_dir, first, steps, every)
    token = f"{os.getpid()}-{os.urandom(4).hex()}"
    return CheckpointRun(save_dir=checkpoint_dir.resolve() if checkpoint_dir else None, every=every or 0, keep=keep,
                         token=token, data=data, model=model, resume=path, first_step=first, alive=alive)


def run_checkpoints(manifest: dict[str, Any], plan_model: dict[str, Any], spec: Any, microbatches: int, opts: Any,
                    echo: Any) -> CheckpointRun | None:
    """`run_pipeline`'s hook: the ranks' CheckpointRun from the RunOptions `opts` (None without checkpoint flags)."""
    flags = opts.checkpoints
    for flag, path in (("--checkpoint-dir", flags.dir), ("--resume", flags.resume)):
        if path is not None:
            check_outside_artifacts(path, flag)  # NOTE [outputs outside the artifacts]
    run = prepare_run(manifest, plan_model, {"batch_size": spec.batch_size, "seq_len": spec.seq_len,
                                             "seed": spec.seed, "microbatches": microbatches}, opts.steps,
                      mode=opts.mode, checkpoint_dir=flags.dir, every=flags.every, keep=flags.keep,
                      resume=flags.resume)
    if run is not None and run.resume is not None:
        echo(f"resuming from {shown(run.resume, quote=False)} (after step {run.first_step}; every file's sha256 "
             "checked)")
    return run


def shown(path: Path, quote: bool = True) -> str:
    """A path to print: relative to the working directory where it is inside it; `quote`d for a shell command."""
    try:
        path = path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return shlex.quote(str(path)) if quote else str(path)
