"""PassManager: runs passes in order, checks what each needs, and instruments them.

A pass is a small frozen dataclass with a kebab-case `name`, the `NodeInfo`
fields it `requires` and `provides`, and `run(gm, ctx) -> PassResult`. Passes
keep no state between runs. Instruments (IR dumps after each pass, printing,
timing) live here, not in the passes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.fsio import atomic_write, check_outside_artifacts, real_dir
from hetpart.ir import dump_text, has_field
from hetpart.ir.printer import dump_dot, dump_json


@dataclass(frozen=True)
class PassContext:
    """What passes may read besides the graph. Explicit, never global."""

    device_types: dict = field(default_factory=dict)  # name -> hetpart.devices.DeviceType
    batch_size: int = 8  # the traced (full) batch
    microbatch_size: int = 8  # costs and memory are per microbatch
    mode: str = "inference"  # "training": the flops and op-cost passes also cost each op's backward
    profiles: dict = field(default_factory=dict)  # device type name -> hetpart.profiler.table.Profile
    meta_runs: dict = field(default_factory=dict)  # the graph's run on meta tensors, shared: NOTE [one meta run]


@dataclass(frozen=True)
class PassResult:
    gm: fx.GraphModule
    changed: bool


class Pass(Protocol):
    name: ClassVar[str]
    summary: ClassVar[str]
    requires: ClassVar[tuple[str, ...]]
    provides: ClassVar[tuple[str, ...]]

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> PassResult: ...


@dataclass
class PassTiming:
    name: str
    seconds: float


# NOTE [--dump-ir DIR is hetpart's]
# `--dump-ir DIR` is any folder the user names, and the dumps have common names
# (graph.json, partition.dot, 00-export.txt), so a folder of the user's own could lose
# files. Dumps go only into a folder that is new, empty, or one hetpart's dumps made:
# it holds `.hetpart-dumps`, which lists every dump written there, and nothing else
# (a file hetpart did not write is refused, named, before anything runs). The marker is
# written before each dump file, so it never misses one of them. A run first removes the
# dumps the marker lists (`_clear_dumps`): one it does not write again (06-partition.txt of
# a --tensor-parallel run, or every dump after the pass that fails now) would pass for its own.
DUMPS_MARKER = ".hetpart-dumps"


def _dumps_listed(where: Path) -> set[str] | None:
    """The dumps the marker of `where` lists; None without a readable marker."""
    marker = where / DUMPS_MARKER
    if marker.is_symlink():
        return None
    try:
        files = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return set(files) if isinstance(files, list) and all(isinstance(f, str) for f in files) else None


def check_dump_dir(where: Path) -> None:
    """An error unless `where` is new, empty or hetpart's dumps only (NOTE [--dump-ir DIR is hetpart's])."""
    check_outside_artifacts(where, "--dump-ir")  # NOTE [outputs outside the artifacts] in fsio.py
    if not (where.exists() or where.is_symlink()):
        return
    real_dir(where, "the IR dumps", "choose another --dump-ir DIR")
    entries = sorted(p.name for p in where.iterdir())
    if not entries:
        return
    listed = _dumps_listed(where)
    foreign = next((e for e in entries if e != DUMPS_MARKER and (listed is None or e not in listed)), None)
    if listed is None or foreign is not None:
        what = f"holds '{foreign}', which hetpart's dumps did not write" if foreign else f"has no {DUMPS_MARKER} marker"
        raise HetpartError(f"--dump-ir {where} {what}; hetpart writes dumps only into a new or empty folder or one "
                           "of its own dumps: choose another --dump-ir DIR")


def _clear_dumps(where: Path) -> None:
    """Remove the dumps an earlier run left in `where`, as its marker lists them (NOTE [--dump-ir DIR is hetpart's]);
    `check_dump_dir` has checked that nothing else is there."""
    listed = _dumps_listed(where)
    if not listed:
        return
    try:
        for name in sorted(listed):
            path = where / name
            if name != DUMPS_MARKER and Path(name).name == name and (path.is_symlink() or path.is_file()):
                path.unlink()  # a name in `where` only, never a folder
        atomic_write(where / DUMPS_MARKER, json.dumps({"files": []}, indent=1) + "\n")
    except OSError as err:
        raise HetpartError(f"cannot remove the earlier IR dumps in '{where}': {err.strerror}; "
                           "pass a writable --dump-ir DIR") from None


def _mark_dumps(where: Path, names: list[str]) -> None:
    listed = _dumps_listed(where) or set()
    if not set(names) <= listed:
        atomic_write(where / DUMPS_MARKER, json.dumps({"files": sorted(listed | set(names))}, indent=1) + "\n")


@dataclass
class PassManager:
    """Runs `passes` in order.

    dump_dir: write `NN-<name>.txt` after each pass (`00-export.txt` is the input),
        `graph.json` (the latest state) and, once nodes carry stages, `partition.dot`.
    extra_dump_dir: the same dumps, also written here (`--dump-ir DIR`): they stay
        when a later step fails, where the artifacts directory is not created.
    print_after: pass names (or "all") whose output IR is printed to `echo`.
    verbose: echo each pass's wall time as it ends.
    on_pass_start: told "pass NN <name>" as each pass starts (a progress display).
    """

    passes: list
    dump_dir: Path | None = None
    print_after: frozenset[str] = frozenset()
    echo: Callable[[str], None] = print
    timings: list[PassTiming] = field(default_factory=list)
    extra_dump_dir: Path | None = None
    verbose: bool = False
    on_pass_start: Callable[[str], None] | None = None
    dump_s: float = 0.0  # seconds spent writing the dumps (timings.json's `write/ir/ (dumps)`)

    def emit(self, gm: fx.GraphModule, index: int, name: str) -> None:
        """Dump and/or print the IR as it stands after step `index` (`name`)."""
        start = time.perf_counter()
        try:
            self._emit(gm, index, name)
        finally:
            self.dump_s += time.perf_counter() - start

    def _emit(self, gm: fx.GraphModule, index: int, name: str) -> None:
        title = f"IR after {index:02d} {name}"
        for where in (self.dump_dir, self.extra_dump_dir):
            if where is None:
                continue
            staged = any(has_field(n, "stage") for n in gm.graph.nodes)
            dumps = {f"{index:02d}-{name}.txt": lambda: dump_text(gm, title),
                     "graph.json": lambda: dump_json(gm),  # the latest state wins
                     **({"partition.dot": lambda: dump_dot(gm)} if staged else {})}
            try:
                where.mkdir(parents=True, exist_ok=True)
                if where == self.extra_dump_dir:  # NOTE [--dump-ir DIR is hetpart's]
                    _mark_dumps(where, list(dumps))
                for file, text in dumps.items():
                    atomic_write(where / file, text())  # NOTE [safe writes]: a link there is replaced
            except OSError as err:
                raise HetpartError(f"cannot write IR dumps to '{where}': {err.strerror}; "
                                   "pass a writable --dump-ir DIR") from None
        if "all" in self.print_after or name in self.print_after:
            self.echo(dump_text(gm, title))

    def run(self, gm: fx.GraphModule, ctx: PassContext) -> fx.GraphModule:
        known = {p.name for p in self.passes} | {"export", "partition", "all"}
        unknown = set(self.print_after) - known
        if unknown:
            raise HetpartError(f"--print-ir-after: unknown pass(es) {sorted(unknown)} (passes: {', '.join(sorted(known))})")
        if self.extra_dump_dir is not None:
            check_dump_dir(self.extra_dump_dir)
            if self.extra_dump_dir.is_dir():
                _clear_dumps(self.extra_dump_dir)
        self.emit(gm, 0, "export")
        for index, p in enumerate(self.passes, start=1):
            missing = [f for f in p.requires if not any(has_field(n, f) for n in gm.graph.nodes)]
            if missing:
                raise HetpartError(f"pass '{p.name}' needs {missing}, which no earlier pass provides")
            if self.on_pass_start is not None:
                self.on_pass_start(f"pass {index:02d} {p.name}")
            start = time.perf_counter()
            try:
                result = p.run(gm, ctx)
            except HetpartError as err:
                raise HetpartError(f"pass '{p.name}': {err}") from None
            except Exception as err:
                raise RuntimeError(f"pass '{p.name}' failed: {type(err).__name__}: {err}") from err
            self.timings.append(PassTiming(p.name, time.perf_counter() - start))
            if self.verbose:
                self.echo(f"pass {index:02d} {p.name}: {self.timings[-1].seconds * 1e3:.1f} ms")
            if result.changed or result.gm is not gm:
                ctx.meta_runs.clear()  # NOTE [one meta run]
            gm = result.gm
            self.emit(gm, index, p.name)
        return gm
