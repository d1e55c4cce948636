"""Weight manifests for plans traced on meta, and `hetpart shard-weights`, which fills them.

NOTE [weight manifests]
A model traced without its weights (`--meta`, NOTE [meta build]) has parameters
with shapes and dtypes but no values. Each rank then gets, instead of
`weights.safetensors`:

    rank<k>/weights.json          every tensor weights.safetensors will hold: key, shape,
                                  dtype, the checkpoint names it may come from, required, and on a
                                  tensor-parallel rank the part of a split weight it holds
    rank<k>/constants.safetensors the values that exist already: buffers (RoPE's
                                  inv_freq, position ids) and constants export lifted

`shard-weights DIR CHECKPOINT` reads a safetensors checkpoint (one file, or an
HF-style sharded `*.safetensors.index.json`), checks every tensor's name,
shape and dtype for every rank before it writes anything, then streams each
rank's `weights.safetensors` tensor by tensor: the header is known from the
manifest, so a tensor is read from the checkpoint (plain reads: see
`Checkpoint`), written and dropped, and peak memory is about the largest
tensor, never a rank's share.
A tensor-parallel rank (NOTE [tensor-parallel stages] in codegen/tp.py) holds only its part of
each split weight: its entry's `split` says which (dim, chunks, rank, degree: `shard_tensor`'s
part of the checkpoint's whole tensor, whose shape is the entry's with `dim` times `degree`), and
shard-weights reads just that part, as `--resume` reads a shard of an old rank's checkpoint
(`plan_reads` and `assemble` of NOTE [checkpoint slices], over safetensors' `get_slice`, the file
mapped for that tensor only): a rank never holds the whole tensor, and shard-weights' peak stays
about the largest tensor (a slice on dim 1 reads the rows it crosses: up to the whole tensor,
let go before the next one).
A checkpoint value wins over a constant (trained BatchNorm statistics); a
parameter with no checkpoint value is an error.

NOTE [shard-weights commit]
shard-weights replaces several files: every rank's weights.safetensors, then
manifest.json (their hashes), and in a signed directory manifest.json.hmac.
No filesystem renames several names at once, so the commit is made as close
to atomic as it can be:

- every new file is written whole to a temp first (NOTE [safe writes] in fsio.py),
  the signature included (computed from the new manifest's bytes in memory);
- then the renames run back to back, with SIGINT and SIGTERM held off
  (`_signals_held`): a Ctrl-C or `kill` lands before the first rename (nothing
  changed) or after the last (all done), never between;
- a signed directory first gets a signature file with two lines, the current
  manifest's signature and the new one's (`check_signature` accepts either),
  then the weights, the manifest, and last the one-line signature: whichever
  manifest is in place verifies at every moment;
- the weights go before the manifest, so between those renames some ranks'
  weights.safetensors do not match the old manifest's hashes. `run` refuses
  that, and shard-weights repairs it: it checks everything it reads (stage.py,
  weights.json, constants, the manifest and its signature) but not the
  weights.safetensors files it is about to replace (`check_rank_files(...,
  need_weights=False)`).

What remains: SIGKILL, a crash or power loss, or a rename that fails (EIO, a
read-only remount) partway through the renames leaves the mixed state above;
running shard-weights again repairs it. A SIGKILL before the renames leaves
temps (`.weights.safetensors.*.tmp`) that `run` and shard-weights refuse as
unlisted files, and name for removal. The renames are not fsync'ed: after a
power loss the filesystem decides which of them survive.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import signal
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from hetpart.errors import REDO_PARTITION, HetpartError
from hetpart.fsio import AtomicWrites, real_dir
from hetpart.shards import split_full_shape
from hetpart.trust import SIGNATURE_NAME, is_signed, read_plain, signature
from hetpart.units import format_bytes

# torch dtype <-> the dtype names of the safetensors format.
SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
TORCH_DTYPES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
MANIFEST_VERSION = 2  # 2: entries may carry a tensor-parallel `split`; version 1 (no splits) is read too


@dataclass(frozen=True)
class WeightEntry:
    """One tensor of a rank's weights.safetensors, as weights.json records it."""

    key: str  # the key in weights.safetensors (the weight's name in the traced model)
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name: F32, BF16, ...
    checkpoint_keys: tuple[str, ...]  # names a checkpoint may store it under, in order of preference
    required: bool  # True: only a checkpoint has its value; False: constants.safetensors has one
    split: dict[str, int] | None = None  # a TP rank's part of the checkpoint tensor: dim, chunks, rank, degree

    def to_json(self) -> dict:
        return {"key": self.key, "shape": list(self.shape), "dtype": self.dtype,
                "checkpoint_keys": list(self.checkpoint_keys), "required": self.required,
                **({"split": dict(self.split)} if self.split is not None else {})}

    @classmethod
    def from_json(cls, data: dict) -> WeightEntry:
        split = data.get("split")
        if split is not None and not (isinstance(split, dict) and set(split) == {"dim", "chunks", "rank", "degree"}
                                      and all(isinstance(v, int) and v >= 0 for v in split.values())
                                      and 0 <= split["dim"] < len(data["shape"]) and split["rank"] < split["degree"]):
            raise ValueError(f"{data['key']}: 'split' is not a TP part (dim, chunks, rank, degree)")
        return cls(data["key"], tuple(data["shape"]), data["dtype"], tuple(data["checkpoint_keys"]),
                   bool(data["required"]), dict(split) if split is not None else None)

    @property
    def full_shape(self) -> tuple[int, ...]:
        """The checkpoint tensor's shape: the entry's, or for a TP part the whole split weight's."""
        return split_full_shape(self.shape, self.split)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * TORCH_DTYPES[self.dtype].itemsize


def _dtype_name(t: torch.Tensor) -> str:
    if t.dtype not in SAFETENSORS_DTYPES:
        raise HetpartError(f"weight of dtype {t.dtype} cannot be stored in safetensors")
    return SAFETENSORS_DTYPES[t.dtype]


def write_weight_manifest(rank_dir: Path, tensors: dict[str, torch.Tensor],
                          checkpoint_names: dict[str, list[str]], shared: dict[str, str] | None = None,
                          shards: dict[str, dict[str, int]] | None = None) -> list[str]:
    """weights.json and constants.safetensors for a rank whose parameters are meta tensors; the files written.

    `shared`: weight -> the earlier rank's weights.safetensors that will hold it (NOTE [weights stored once]),
    recorded as weights.json's `shared`, so that shard-weights lists that file, with its hash, for this rank.
    `shards`: a TP rank's split weights -> its part (dim, chunks, rank, degree), each entry's `split`."""
    entries, constants, shards = [], {}, shards or {}
    for key in sorted(tensors):
        t = tensors[key]
        if not t.is_meta:
            constants[key] = t.detach().contiguous()
        entries.append(WeightEntry(key, tuple(t.shape), _dtype_name(t), tuple(checkpoint_names.get(key, [])),
                                   required=t.is_meta, split=shards.get(key)))
    save_file(constants, str(rank_dir / "constants.safetensors"), metadata={"format": "pt"})
    (rank_dir / "weights.json").write_text(json.dumps(
        {"format_version": MANIFEST_VERSION if shards else 1, "tensors": [e.to_json() for e in entries],
         **({"shared": dict(sorted(shared.items()))} if shared else {})}, indent=1) + "\n")
    return ["weights.json", "constants.safetensors"]


def read_shared_files(path: Path) -> set[str]:
    """The earlier ranks' weights.safetensors (`../rank<j>/weights.safetensors`) whose weights the rank of the
    weight manifest `path` reads (NOTE [weights stored once])."""
    try:
        shared = json.loads(path.read_text()).get("shared", {})
        if not (isinstance(shared, dict) and all(isinstance(f, str) for f in shared.values())):
            raise ValueError("'shared' is not weight -> file")
        return set(shared.values())
    except (OSError, ValueError, AttributeError) as err:
        raise HetpartError(f"{path}: not a readable weight manifest ({err}); {REDO_PARTITION}") from None


def read_weight_manifest(path: Path) -> list[WeightEntry]:
    try:
        data = json.loads(path.read_text())
        if data.get("format_version") not in (1, MANIFEST_VERSION):
            raise HetpartError(f"{path}: weight manifest format_version {data.get('format_version')!r}; "
                               f"this hetpart reads 1 to {MANIFEST_VERSION}: {REDO_PARTITION}, with this hetpart")
        return [WeightEntry.from_json(e) for e in data["tensors"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HetpartError(f"{path}: not a readable weight manifest ({err}); {REDO_PARTITION}") from None


class Checkpoint:
    """A safetensors checkpoint: one file, or an HF-style index of shards.

    Tensors are read with plain file reads, not safetensors' memory map: pages of a mapped
    file that were read count in the process's RSS until it is unmapped, so streaming a
    whole checkpoint through `safe_open` peaks at the checkpoint's size (measured in
    benchmarks/shard_weights.py). The format is a little-endian u64 header size, a JSON
    header (dtype, shape, data_offsets per tensor) and the data.
    """

    def __init__(self, path: Path):
        self.path = path
        self.file_of: dict[str, Path] = {}
        self._headers: dict[Path, tuple[int, dict]] = {}
        index = self._find_index(path)
        if index is not None:
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
                    raise ValueError(f"weight_map is {type(weight_map).__name__}, not names -> file names")
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
                raise HetpartError(f"checkpoint index {index}: unreadable ({err}); expected a JSON file "
                                   'with a "weight_map" of tensor name -> shard file') from None
            for key, shard in weight_map.items():
                self.file_of[key] = index.parent / shard
            missing = sorted({str(f) for f in self.file_of.values() if not f.is_file()})
            if missing:
                raise HetpartError(f"checkpoint index {index} names shard file(s) that do not exist: "
                                   f"{', '.join(missing[:5])}")
        else:
            file = path if path.is_file() else self._single_file(path)
            for key in self._header(file):
                self.file_of[key] = file

    @staticmethod
    def _find_index(path: Path) -> Path | None:
        if path.is_file():
            return path if path.name.endswith(".json") else None
        if not path.is_dir():
            raise HetpartError(f"checkpoint '{path}' not found; pass a .safetensors file, a "
                               "*.safetensors.index.json, or a directory holding one")
        found = sorted(path.glob("*.safetensors.index.json"))
        if len(found) > 1:
            raise HetpartError(f"checkpoint directory {path} has several indexes ({', '.join(f.name for f in found)}); "
                               "pass the one to use")
        return found[0] if found else None

    @staticmethod
    def _single_file(path: Path) -> Path:
        files = sorted(path.glob("*.safetensors"))
        if len(files) != 1:
            raise HetpartError(f"checkpoint directory {path} has {len(files)} .safetensors files and no "
                               "*.safetensors.index.json; pass one file or add the index")
        return files[0]

    def _header(self, file: Path) -> dict:
        if file not in self._headers:
            try:
                with file.open("rb") as f:
                    (size,) = struct.unpack("<Q", f.read(8))
                    if size > 100 << 20:
                        raise ValueError(f"header of {size} bytes")
                    header = json.loads(f.read(size))
                header.pop("__metadata__", None)
            except (OSError, ValueError, struct.error) as err:
                raise HetpartError(f"checkpoint file {file}: not a safetensors file ({err})") from None
            self._headers[file] = (8 + size, header)
        return self._headers[file][1]

    def find(self, names: Iterable[str]) -> str | None:
        return next((n for n in names if n in self.file_of), None)

    def _entry(self, key: str) -> dict:
        entry = self._header(self.file_of[key]).get(key)
        if entry is None:
            raise HetpartError(f"checkpoint: the index puts '{key}' in {self.file_of[key]}, which does not hold it")
        return entry

    def shape_dtype(self, key: str) -> tuple[tuple[int, ...], str]:
        entry = self._entry(key)
        return tuple(entry["shape"]), entry["dtype"]

    def data_bytes(self, key: str) -> int:
        """The bytes of the tensor `key`'s data in its file (its header's data_offsets)."""
        start, end = self._entry(key)["data_offsets"]
        return end - start

    def tensor(self, key: str) -> torch.Tensor:
        """The tensor `key`, read into fresh memory (freed when the caller drops it)."""
        entry, file = self._entry(key), self.file_of[key]
        start, end = entry["data_offsets"]
        data = bytearray(end - start)
        with file.open("rb") as f:
            f.seek(self._headers[file][0] + start)
            if f.readinto(data) != len(data):
                raise HetpartError(f"checkpoint file {file}: '{key}' is cut short; the file is truncated")
        dtype = TORCH_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise HetpartError(f"checkpoint: '{key}' has dtype {entry['dtype']}, which hetpart cannot read")
        if not data:
            return torch.empty(entry["shape"], dtype=dtype)
        return torch.frombuffer(data, dtype=dtype).reshape(entry["shape"])

    def part(self, key: str, split: dict[str, int]) -> torch.Tensor:
        """TP rank `split["rank"]`'s part of the tensor `key` (`shard_tensor`'s, NOTE [weight manifests]): only
        its slices read, through safetensors' `get_slice` on a map of the file closed before returning."""
        from hetpart.runtime.checkpoint_slices import Layout, assemble, plan_reads, shard_layout

        shape, dtype = self.shape_dtype(key)
        if dtype not in TORCH_DTYPES:
            raise HetpartError(f"checkpoint: '{key}' has dtype {dtype}, which hetpart cannot read")
        file = str(self.file_of[key])
        need = shard_layout(shape, split)
        try:
            with safe_open(file, "pt") as f:
                return assemble(need, plan_reads(key, need, [(file, Layout(shape))]), lambda _: f.get_slice(key))
        except (OSError, SafetensorError) as err:
            raise HetpartError(f"checkpoint file {file}: cannot read '{key}' ({err})") from None


def write_safetensors_streaming(f: BinaryIO, entries: list[WeightEntry],
                                value: Callable[[WeightEntry], torch.Tensor]) -> str:
    """A safetensors file whose tensors are produced one at a time by `value` (the header comes first,
    from the entries' shapes and dtypes), written to the open file `f`; its sha256. safetensors' own
    writers take every tensor at once."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for e in entries:
        header[e.key] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    digest = hashlib.sha256()
    for chunk in (struct.pack("<Q", len(raw)), raw):
        f.write(chunk)
        digest.update(chunk)
    for e in entries:
        t = value(e).contiguous()
        if tuple(t.shape) != e.shape or SAFETENSORS_DTYPES.get(t.dtype) != e.dtype:
            raise HetpartError(f"'{e.key}' is {SAFETENSORS_DTYPES.get(t.dtype, t.dtype)} {list(t.shape)}; the "
                               f"header says {e.dtype} {list(e.shape)}")
        if t.numel():
            data = t.reshape(-1).view(torch.uint8).numpy()  # the buffer itself, no copy
            f.write(data)
            digest.update(data)
    return digest.hexdigest()  # the manifest's hash, without reading the file back


def write_weights(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """`tensors` as the safetensors file `path`, by key, hashed as it is written; its sha256. No copy of the
    tensors (safetensors' save_file makes one in memory) and no second read of the file to hash it."""
    entries = [WeightEntry(key, tuple(t.shape), _dtype_name(t), (), required=False)
               for key, t in sorted(tensors.items())]
    with path.open("wb") as f:
        return write_safetensors_streaming(f, entries, lambda e: tensors[e.key])


@dataclass
class ShardResult:
    ranks: int
    tensors: int
    bytes_written: int
    from_checkpoint: int
    cast: int


def _constant_keys(path: Path) -> set[str]:
    """The keys of a rank's constants.safetensors (its header only)."""
    try:
        with safe_open(str(path), "pt") as f:
            return set(f.keys())
    except (OSError, SafetensorError) as err:
        raise HetpartError(f"{path}: not a readable safetensors file ({err}); {REDO_PARTITION}") from None


def plan_sources(out: Path, manifest: dict, ckpt: Checkpoint, allow_cast: bool
                 ) -> list[tuple[Path, list[WeightEntry], dict[str, str | None]]]:
    """For each rank: its dir, its entries and the checkpoint key of each (None: its constant).
    Checks every name, shape and dtype first and raises one error listing every problem."""
    problems: list[str] = []
    plans = []
    for rank in manifest["ranks"]:
        rank_dir = real_dir(out / rank["dir"], "the rank's weights")
        entries = read_weight_manifest(rank_dir / "weights.json")
        constants = _constant_keys(rank_dir / "constants.safetensors")
        source: dict[str, str | None] = {}
        for e in entries:
            key = ckpt.find(e.checkpoint_keys)
            if key is None:
                if e.required:
                    names = list(e.checkpoint_keys) or [e.key]
                    close = difflib.get_close_matches(names[0], list(ckpt.file_of), n=2)
                    problems.append(f"rank {rank['rank']}: '{names[0]}' is not in the checkpoint"
                                    + (f" (close: {', '.join(close)})" if close else ""))
                elif e.key not in constants:
                    problems.append(f"rank {rank['rank']}: '{e.key}' is in neither the checkpoint nor "
                                    f"{rank_dir / 'constants.safetensors'} ({REDO_PARTITION})")
                source[e.key] = None
                continue
            shape, dtype = ckpt.shape_dtype(key)
            if shape != e.full_shape:
                part = (f" (this rank holds part {e.split['rank']} of {e.split['degree']} on dim {e.split['dim']}: "
                        f"{list(e.shape)})" if e.split is not None else "")
                problems.append(f"rank {rank['rank']}: '{key}' has shape {list(shape)} in the checkpoint, "
                                f"the plan needs {list(e.full_shape)}{part}")
            elif dtype != e.dtype and not allow_cast:
                problems.append(f"rank {rank['rank']}: '{key}' is {dtype} in the checkpoint, the plan traced "
                                f"{e.dtype} (pass --allow-cast to convert, or partition with the checkpoint's dtype)")
            source[e.key] = key
        plans.append((rank_dir, entries, source))
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise HetpartError(f"checkpoint {ckpt.path} does not match the plan in {out} ({len(problems)} problem(s)):\n  "
                           + "\n  ".join(problems[:20]) + more
                           + "\n  nothing was written; check that the checkpoint is for the same model and config")
    return plans


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held off for the block, then delivered (NOTE [shard-weights commit]).

    Their handlers are swapped for one that records them, rather than masked with
    `signal.pthread_sigmask`: a mask holds only this thread, the kernel then hands a
    `kill` to another thread (torch's), and Python still runs the handler in this one.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can be set from the main thread only, and run only there
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, _frame: caught.append(signum)) for s in held}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(caught):
            signal.raise_signal(s)  # to the handler that was there: Terminated, KeyboardInterrupt, or the default


def shard_weights(out: Path, checkpoint: Path, *, allow_cast: bool = False, sign_key: bytes | None = None,
                  echo: Callable[[str], None] = lambda _: None) -> ShardResult:
    """Fill every rank's weights.safetensors of the meta-traced plan in `out` from `checkpoint`
    (NOTE [weight manifests]); updates manifest.json's hashes last, and with `sign_key` signs it
    (the caller has checked the directory and its signature: `check_before_shard`).

    All or nothing: everything is checked first (the manifest as `run` checks it, every tensor,
    every rank's folder), each new file is written to a temp beside its target, and only once
    every one is complete are they renamed into place (NOTE [shard-weights commit]). A failure
    before the renames removes the temps and leaves every old file as it was.
    """
    from hetpart.runtime.artifacts import load_manifest  # the checks `run` makes: ranks[i].dir inside `out`

    manifest = load_manifest(out)
    current = read_plain(out / "manifest.json")  # what check_before_shard checked (its signature with sign_key)
    ranks = manifest["ranks"]
    for rank in ranks:
        if "weights.json" not in rank["files"]:
            raise HetpartError(f"{out}: rank {rank['rank']} has its weights already (no weights.json): this plan "
                               "was traced with them; shard-weights fills plans made with `partition --meta`")
    ckpt = Checkpoint(checkpoint)
    result = ShardResult(len(ranks), 0, 0, 0, 0)
    plans = plan_sources(out, manifest, ckpt, allow_cast)
    with AtomicWrites() as pending, AtomicWrites() as transition:
        digests = []
        for rank, (rank_dir, entries, source) in zip(ranks, plans):
            constants = load_file(str(rank_dir / "constants.safetensors"))

            def value(e: WeightEntry) -> torch.Tensor:
                key = source[e.key]
                if key is None:
                    return constants[e.key]
                t = ckpt.tensor(key) if e.split is None else ckpt.part(key, e.split)
                if SAFETENSORS_DTYPES.get(t.dtype) != e.dtype:
                    result.cast += 1
                    t = t.to(TORCH_DTYPES[e.dtype])
                result.from_checkpoint += 1
                return t

            target = rank_dir / "weights.safetensors"
            try:
                with pending.open(target) as f:
                    digests.append(write_safetensors_streaming(f, entries, value))
            except OSError as err:
                raise HetpartError(f"rank {rank['rank']}: cannot write {target}: {err.strerror}; nothing was "
                                   "changed (every old file is kept)") from None
            except HetpartError as err:
                raise HetpartError(f"rank {rank['rank']}: {err}; nothing was changed (every old file is kept)"
                                   ) from None
            result.tensors += len(entries)
            result.bytes_written += sum(e.nbytes for e in entries)
            echo(f"rank {rank['rank']}: {len(entries)} tensor(s), {format_bytes(sum(e.nbytes for e in entries))}")
        for rank, digest in zip(ranks, digests):
            rank["files"]["weights.safetensors"] = digest
        by_dir = {rank["dir"]: digest for rank, digest in zip(ranks, digests)}
        for rank, (rank_dir, _, _) in zip(ranks, plans):  # NOTE [weights stored once]: the one copy, by hash
            for file in sorted(read_shared_files(rank_dir / "weights.json")):
                parts = file.split("/")
                if len(parts) != 3 or parts[1] not in by_dir:
                    raise HetpartError(f"{rank_dir / 'weights.json'}: shared file {file!r} is no rank's "
                                       f"weights.safetensors; {REDO_PARTITION}")
                rank["files"][file] = by_dir[parts[1]]
        new = (json.dumps(manifest, indent=2) + "\n").encode()
        pending.write(out / "manifest.json", new)
        if sign_key is not None:
            if is_signed(out):  # either manifest verifies while the renames run
                transition.write(out / SIGNATURE_NAME, f"{signature(current, sign_key)}\n{signature(new, sign_key)}\n")
            pending.write(out / SIGNATURE_NAME, signature(new, sign_key) + "\n")
        with _signals_held():
            try:
                transition.commit()
                pending.commit()  # the weights, the manifest, the signature: in the order written
            except HetpartError as err:
                again = f"hetpart shard-weights {out} {checkpoint}" + (" --sign-key KEY" if sign_key else "")
                raise HetpartError(f"{err}; the renames were cut short: run `{again}` again to finish them "
                                   "(NOTE [shard-weights commit])") from None
    return result

