"""The profile table: measured op times by key, as `hetpart profile` writes them and the op-cost pass reads them.

`hetpart/profiler/measure.py` fills a `Profile`; `passes/op_cost.py` uses the measured time for the
profile's device type wherever the table has the op's key, and the roofline elsewhere
(`hetpart partition --profile FILE`).

NOTE [profile keys]
An op is keyed by what decides its time, not by where it sits in a model: its
target and its arguments, each tensor written as dtype and shape (`f32[2,64]`),
every other argument as its Python repr:

    aten.linear.default(f32[2,64], f32[32,64], f32[32])

so a profile of one model serves another with the same ops at the same shapes
(every block of a transformer shares one entry, and so do two models of the
same width). Node names never appear in keys. Several nodes with one key are
measured together: the entry is the median of all their repeats.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.fsio import atomic_write, check_not_special, check_outside_artifacts
from hetpart.ir.info import DTYPE_NAMES


FORMAT_VERSION = 1


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = DTYPE_NAMES.get(value.dtype, str(value.dtype).removeprefix("torch."))
        return f"{dtype}[{','.join(str(int(d)) for d in value.shape)}]"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    if isinstance(value, torch.SymInt):
        return str(int(value.node.hint)) if value.node.has_hint() else str(value)
    return repr(value)


def op_key(node: fx.Node, values: dict[fx.Node, Any]) -> str:
    """The profile key of `node` (NOTE [profile keys]); `values` holds its inputs (real or meta tensors)."""
    load = lambda a: values[a]  # noqa: E731
    args = fx.node.map_arg(node.args, load)
    kwargs = fx.node.map_arg(node.kwargs, load)
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in sorted(kwargs.items())]
    return f"{target_name(node.target)}({', '.join(parts)})"


def target_name(target: Any) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))


def backward_key(node: fx.Node, values: dict[fx.Node, Any], needs: set[fx.Node]) -> str:
    """The profile key of `node`'s backward: its forward key and which of its inputs get a gradient."""
    mask = "".join("1" if a in needs else "0" for a in node.all_input_nodes)
    return f"{op_key(node, values)} backward[{mask}]"


def profiled(node: fx.Node) -> bool:
    """Ops the profile measures: every call except tuple unpacking and scalar (SymInt) arithmetic."""
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    return isinstance(node.target, torch._ops.OpOverload) and node.target is not torch.ops.aten.sym_size.int


@dataclass
class Profile:
    """Measured forward times (ns, at one microbatch size) for one device type, by `op_key`."""

    device_type: str
    threads: int
    forward_ns: dict[str, int] = field(default_factory=dict)
    backward_ns: dict[str, int] = field(default_factory=dict)  # by `backward_key`; empty without --backward
    device: str = "cpu"  # the torch device it was measured on
    source: str = ""  # what was profiled (model spec), for the reader
    clock: str = "wall"  # "thread_cpu" or "wall" (NOTE [profile clock])
    concurrent: int = 1  # processes running the graph while it was timed (NOTE [concurrent profile])
    sibling_passes: int = 0  # passes the concurrent-1 siblings ran meanwhile, all together
    sibling_duty: float = 1.0  # the share of the time each sibling computed (`sibling_duty`)
    speed_scale: float = 1.0  # the device it stands for runs this many times as fast as the one measured

    def scaled(self, speed_scale: float) -> Profile:
        """This profile for a device `speed_scale` times as fast as the one measured (`hetpart profile
        --speed-scale`): every time divided by it, rounded to the nanosecond, and the factor recorded."""
        if isinstance(speed_scale, bool) or not isinstance(speed_scale, (int, float)) or not (
                math.isfinite(speed_scale) and speed_scale > 0):
            raise HetpartError(f"--speed-scale {speed_scale!r}: must be a positive number (the emulated device's "
                               "speed relative to this machine: 0.5 is half as fast, 2 twice as fast)")
        scale = lambda table: {k: round(ns / speed_scale) for k, ns in table.items()}  # noqa: E731
        return dataclasses.replace(self, forward_ns=scale(self.forward_ns), backward_ns=scale(self.backward_ns),
                                   speed_scale=self.speed_scale * speed_scale)

    def to_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, "device_type": self.device_type, "device": self.device,
                "threads": self.threads, "clock": self.clock, "concurrent": self.concurrent,
                "sibling_passes": self.sibling_passes, "sibling_duty": self.sibling_duty, "speed_scale": self.speed_scale,
                "torch_version": torch.__version__,
                "source": self.source,
                "forward_ns": dict(sorted(self.forward_ns.items())),
                "backward_ns": dict(sorted(self.backward_ns.items()))}

    def save(self, path: Path) -> None:
        """Write the profile to `path` whole or not at all; a symlink there is replaced, its target never
        written (NOTE [safe writes] in hetpart/fsio.py)."""
        check_output_path(path)
        atomic_write(path, json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(path: Path) -> Profile:
        if Path(path).exists() and not Path(path).is_file():  # a FIFO or a device would block the read
            raise HetpartError(f"--profile {path}: not a regular file; pass a profile JSON file")
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise HetpartError(f"--profile {path}: no such file; write one with `hetpart profile MODEL --out {path}`") from None
        except (OSError, ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError are ValueErrors
            raise HetpartError(f"--profile {path}: not a profile JSON file ({err})") from None
        if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION or not isinstance(
                data.get("forward_ns"), dict) or not isinstance(data.get("device_type"), str):
            raise HetpartError(f"--profile {path}: expected format_version {FORMAT_VERSION} with device_type and "
                               "forward_ns; write it again with `hetpart profile`")
        backward = data.get("backward_ns", {})
        bad = [k for table in (data["forward_ns"], backward) for k, v in table.items()
               if not isinstance(v, int) or v < 0]
        if bad or not isinstance(backward, dict):
            raise HetpartError(f"--profile {path}: forward_ns and backward_ns must map keys to non-negative "
                               f"integers (ns); bad: {bad[:3]}")
        concurrent = data.get("concurrent", 1)
        if not isinstance(concurrent, int) or concurrent < 1:
            raise HetpartError(f"--profile {path}: concurrent must be an integer >= 1 (got {concurrent!r}); "
                               "write it again with `hetpart profile`")
        threads, passes, duty = data.get("threads", 1), data.get("sibling_passes", 0), data.get("sibling_duty", 1.0)
        if (not isinstance(threads, int) or threads < 1 or not isinstance(passes, int) or passes < 0
                or isinstance(duty, bool) or not isinstance(duty, (int, float)) or not 0 <= duty <= 1):
            raise HetpartError(f"--profile {path}: threads (>= 1), sibling_passes (>= 0) and sibling_duty (0 to 1) "
                               "must be numbers in range; write it again with `hetpart profile`")
        speed = data.get("speed_scale", 1.0)  # files written before --speed-scale: measured as they are
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not (math.isfinite(speed) and speed > 0):
            raise HetpartError(f"--profile {path}: speed_scale must be a positive number (got {speed!r}); "
                               "write it again with `hetpart profile`")
        return Profile(data["device_type"], threads, data["forward_ns"], backward,
                       str(data.get("device", "cpu")), str(data.get("source", "")), str(data.get("clock", "wall")),
                       concurrent, passes, float(duty), float(speed))


def check_output_path(path: Path) -> None:
    """`profile --out`: a file that can be written, checked before minutes of profiling."""
    check_not_special(path, "--out", "choose a file for the profile (`partition --profile FILE` reads it)")
    if path.is_dir():
        raise HetpartError(f"--out {path} is a directory; give a file name, e.g. --out {path / 'profile.json'}")
    parent = path.parent
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise HetpartError(f"--out {path}: its folder {parent} {what}; create the folder or choose another --out")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise HetpartError(f"--out {path}: cannot write there (permission denied); choose another --out")
    check_outside_artifacts(path, "--out", follow=False)  # NOTE [outputs outside the artifacts] in fsio.py
    if path.exists() and not path.is_symlink():  # a link is replaced, its target kept (NOTE [safe writes])
        try:
            Profile.load(path)
        except HetpartError:
            raise HetpartError(f"--out {path} exists and is not a profile `hetpart profile` wrote; hetpart replaces "
                               "only its own: move it away, or choose another --out") from None
