"""PassManager: runs passes in order, checks what each needs, and instruments them.

A pass is a small frozen dataclass with a kebab-case `name`, the `NodeInfo`
fields it `requires` and `provides`, and `run(gm, ctx) -> PassResult`. Passes
keep no state between runs. Instruments (IR dumps after each pass, printing,
timing) live here, not in the passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.fsio import atomic_write
from hetpart.ir import dump_text, has_field
from hetpart.ir.printer import dump_dot, dump_json


@dataclass(frozen=True)
class PassContext:
    """What passes may read besides the graph. Explicit, never global."""

    device_types: dict = field(default_factory=dict)  # name -> hetpart.devices.DeviceType
    batch_size: int = 8  # the traced (full) batch
    microbatch_size: int = 8  # costs and memory are per microbatch
    mode: str = "inference"  # "training": the flops and op-cost passes also cost each op's backward
    profiles: dict = field(default_factory=dict)  # device type name -> hetpart.passes.profile.Profile


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

    def emit(self, gm: fx.GraphModule, index: int, name: str) -> None:
        """Dump and/or print the IR as it stands after step `index` (`name`)."""
        title = f"IR after {index:02d} {name}"
        for where in (self.dump_dir, self.extra_dump_dir):
            if where is None:
                continue
            try:
                where.mkdir(parents=True, exist_ok=True)
                # `--dump-ir DIR` may hold anything already: NOTE [safe writes]
                atomic_write(where / f"{index:02d}-{name}.txt", dump_text(gm, title))
                atomic_write(where / "graph.json", dump_json(gm))  # the latest state wins
                if any(has_field(n, "stage") for n in gm.graph.nodes):
                    atomic_write(where / "partition.dot", dump_dot(gm))
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
            gm = result.gm
            self.emit(gm, index, p.name)
        return gm
