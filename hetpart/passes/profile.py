"""Measured op times on the local device: `hetpart profile`, and the table the op-cost pass reads.

`profile_graph` runs an exported graph on real tensors at the microbatch size,
pass after pass (warm-up passes, then timed ones), with the thread count a
runtime rank uses, and records each op's median time under its `op_key`. The op-cost
pass uses the measured time for the profile's device type wherever the table
has the op's key, and the roofline elsewhere (`hetpart partition --profile FILE`).

NOTE [profile keys]
An op is keyed by what decides its time, not by where it sits in a model: its
target and its arguments, each tensor written as dtype and shape (`f32[2,64]`),
every other argument as its Python repr:

    aten.linear.default(f32[2,64], f32[32,64], f32[32])

so a profile of one model serves another with the same ops at the same shapes
(every block of a transformer shares one entry, and so do two models of the
same width). Node names never appear in keys. Several nodes with one key are
measured together: the entry is the median of all their repeats.

NOTE [profile passes]
Ops are timed where they run: each timed pass runs the whole graph in order
and times every op inside it, so an op meets the caches as a real forward
leaves them (a weight bigger than the caches comes from memory, as it does
in a stage), and each value is freed after its last use, as the stage's
generated code does, so the allocator hands out the same warm memory. Timing
one op many times in a row would keep its weights cache-hot:
on zoo:mlp (hidden 512, microbatch 4) that read 442 us for a 4 MiB linear
that takes twice as long inside the forward.

NOTE [backward timing]
With `backward=True` (`hetpart profile --backward`) every op whose output needs a
gradient also has its backward timed: its inputs that need one become fresh
leaves, the op runs once under autograd, and `torch.autograd.grad` (gradients of
ones) is timed like the forward, keyed `backward_key` (the forward key plus which
inputs get a gradient). A lone `autograd.grad` call pays the engine's start-up,
which a training step pays once for the whole graph: the time of the same call on
a 1-element product is subtracted (floored at 0).

NOTE [profile clock]
A CPU profile with one thread (what a `hetpart run` rank uses) is timed with
the thread's CPU time (`time.thread_time_ns`), not wall time: it counts the
work the op does on its core and not the time other processes held that core,
so a profile taken on a busy machine matches one taken on an idle one (on
this shared 2-core VM, zoo:mlp's forward read 10.3 +- 0.3 ms of CPU time
while its wall time ranged 10-19 ms). With several threads, or on CUDA
(synchronised), it is wall time. The profile records which (`clock`).

NOTE [profile threads]
`hetpart run` starts one process per stage with OMP_NUM_THREADS=1 unless the
environment sets it (runtime/launch.py), so each rank computes with that many
threads; the profile measures with the same count (`runtime_threads`) and
records it. A profile is only as good as its match to the runtime: measure on
the machine (and load) the plan is for.
"""

from __future__ import annotations

import json
import operator
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.passes.flops import has_floating

FORMAT_VERSION = 1


def runtime_threads() -> int:
    """Threads per rank under `hetpart run` (NOTE [profile threads])."""
    return int(os.environ.get("OMP_NUM_THREADS", "1"))


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        from hetpart.passes.shape import DTYPE_NAMES

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
    return f"{_target_name(node.target)}({', '.join(parts)})"


def _target_name(target: Any) -> str:
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

    def to_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, "device_type": self.device_type, "device": self.device,
                "threads": self.threads, "clock": self.clock, "torch_version": torch.__version__,
                "source": self.source,
                "forward_ns": dict(sorted(self.forward_ns.items())),
                "backward_ns": dict(sorted(self.backward_ns.items()))}

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(path: Path) -> Profile:
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise HetpartError(f"--profile {path}: no such file; write one with `hetpart profile MODEL --out {path}`") from None
        except (OSError, json.JSONDecodeError) as err:
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
        return Profile(data["device_type"], int(data.get("threads", 1)), data["forward_ns"], backward,
                       data.get("device", "cpu"), data.get("source", ""), data.get("clock", "wall"))


def _sync(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def op_clock(device: torch.device, threads: int) -> Callable[[], int]:
    """NOTE [profile clock]: this thread's CPU time for one-thread CPU profiles, else wall time."""
    if device.type == "cpu" and threads == 1:
        return time.thread_time_ns
    return time.perf_counter_ns


def _time_ns(call: Callable[[], Any], warmup: int, repeats: int, sync: Callable[[], None],
             clock: Callable[[], int] = time.perf_counter_ns) -> tuple[list[int], Any]:
    for _ in range(warmup):
        call()
    sync()
    times, out = [], None
    for _ in range(repeats):
        start = clock()
        out = call()
        sync()
        times.append(clock() - start)
    return times, out


def _backward_call(node: fx.Node, values: dict[fx.Node, Any], needs: set[fx.Node]) -> Callable[[], Any] | None:
    """A call that runs `node`'s backward once: its inputs that need a gradient as fresh leaves."""
    leaves = {a: values[a].detach().requires_grad_(True) for a in node.all_input_nodes
              if a in needs and isinstance(values[a], torch.Tensor) and values[a].is_floating_point()}
    if not leaves:
        return None
    env = {a: leaves.get(a, values[a]) for a in node.all_input_nodes}
    with torch.enable_grad():
        out = node.target(*fx.node.map_arg(node.args, env.__getitem__), **fx.node.map_arg(node.kwargs, env.__getitem__))
    outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        return None
    grads = [torch.ones_like(o) for o in outs]
    inputs = list(leaves.values())
    return lambda: torch.autograd.grad(outs, inputs, grads, retain_graph=True, allow_unused=True)


def profile_graph(gm: fx.GraphModule, inputs: tuple, device_type: str, *, device: str = "cpu",
                  repeats: int = 20, warmup: int = 3, threads: int | None = None, source: str = "",
                  backward: bool = False) -> Profile:
    """Run `gm` on `inputs` (one microbatch) and time each op; see NOTE [profile passes].

    `warmup` untimed passes, then `repeats` timed passes over the whole graph; an op's time
    is the median over the timed passes (and over every node with its key). The graph's
    weights and inputs are moved to `device`. With `backward`, every op whose output needs a
    gradient (NOTE [backward formulas] in flops.py) also has its backward timed
    (NOTE [backward timing]) under `backward_key`.
    """
    if repeats < 1 or warmup < 0:
        raise HetpartError(f"--repeats must be >= 1 (got {repeats})")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HetpartError("--device cuda: CUDA is not available on this machine; use --device cpu")
    threads = runtime_threads() if threads is None else threads
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    sync = _sync(dev)
    clock = op_clock(dev, threads)
    samples: dict[str, list[int]] = {}
    bwd_samples: dict[str, list[int]] = {}
    weights: dict[fx.Node, Any] = {}
    needs: set[fx.Node] = set()
    for node in gm.graph.find_nodes(op="get_attr"):
        obj: Any = gm
        for part in node.target.split("."):
            obj = getattr(obj, part)
        weights[node] = obj.to(dev) if isinstance(obj, torch.Tensor) else obj
        if isinstance(obj, torch.nn.Parameter) and obj.requires_grad and obj.is_floating_point():
            needs.add(node)
    # Free each value after its last use, as a stage's generated forward does (NOTE [profile passes]).
    last_use: dict[fx.Node, fx.Node] = {}
    for node in reversed(gm.graph.nodes):
        for a in node.all_input_nodes:
            last_use.setdefault(a, node)
    freed_after: dict[fx.Node, list[fx.Node]] = {}
    for value_node, user in last_use.items():
        if value_node.op != "get_attr":
            freed_after.setdefault(user, []).append(value_node)
    try:
        for index in range(warmup + repeats):
            timed = index >= warmup
            values: dict[fx.Node, Any] = dict(weights)
            placeholders = iter(inputs)
            backwards: list[tuple[str, Callable[[], Any]]] = []
            with torch.no_grad():
                for node in gm.graph.nodes:
                    if node.op == "placeholder":
                        values[node] = next(placeholders).to(dev)
                    if node.op != "call_function":
                        continue
                    args = fx.node.map_arg(node.args, values.__getitem__)
                    kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
                    if "device" in kwargs and isinstance(kwargs["device"], torch.device):
                        kwargs = {**kwargs, "device": dev}
                    if profiled(node):
                        sync()
                        start = clock()
                        values[node] = node.target(*args, **kwargs)
                        sync()
                        if timed:
                            samples.setdefault(op_key(node, values), []).append(clock() - start)
                    else:
                        values[node] = node.target(*args, **kwargs)
                    if any(a in needs for a in node.all_input_nodes) and has_floating(values[node]):
                        needs.add(node)  # NOTE [backward formulas]: the same rule as `needs_grad`
                        call = _backward_call(node, values, needs) if backward and profiled(node) else None
                        if call is not None:
                            backwards.append((backward_key(node, values, needs), call))
                    for done in freed_after.get(node, ()):
                        del values[done]
            for key, call in reversed(backwards):  # in the order a backward pass runs them
                sync()
                start = clock()
                call()
                sync()
                if timed:
                    bwd_samples.setdefault(key, []).append(clock() - start)
    finally:
        torch.set_num_threads(old_threads)
    median = lambda table: {k: int(statistics.median(v)) for k, v in table.items()}  # noqa: E731
    backward_ns = median(bwd_samples)
    if backward_ns:
        # NOTE [backward timing]: one `autograd.grad` call per op pays the engine's fixed start-up, which a
        # training step pays once for the whole graph; it is measured on a 1-element product and taken off.
        leaf = torch.ones(1, device=dev, requires_grad=True)
        with torch.enable_grad():
            alias = leaf * 1.0
        one = torch.ones_like(alias)
        engine_ns = int(statistics.median(_time_ns(lambda: torch.autograd.grad(alias, leaf, one, retain_graph=True),
                                                   warmup, repeats, sync, clock)[0]))
        backward_ns = {k: max(0, ns - engine_ns) for k, ns in backward_ns.items()}
    return Profile(device_type, threads, median(samples), backward_ns, device=dev.type, source=source,
                   clock="thread_cpu" if clock is time.thread_time_ns else "wall")


def profile_model(spec: Any, microbatches: int, device_type: str, *, device: str = "cpu", repeats: int = 20,
                  warmup: int = 3, threads: int | None = None, backward: bool = False) -> Profile:
    """`hetpart profile`: build and export `spec` (a ModelSpec) as `partition` does, then `profile_graph`
    at the microbatch size `spec.batch_size / microbatches` on the model's own example inputs."""
    from hetpart.frontend import export_model, load_model  # the frontend sits beside passes, not below

    if microbatches < 1 or spec.batch_size % microbatches:
        raise HetpartError(f"--microbatches {microbatches} must be >= 1 and divide --batch-size {spec.batch_size}")
    module, inputs = load_model(spec)
    gm = export_model(module, inputs)
    micro = spec.batch_size // microbatches
    return profile_graph(gm, tuple(x[:micro] for x in inputs), device_type, device=device, repeats=repeats,
                         warmup=warmup, threads=threads, backward=backward, source=f"{spec.model} {dict(spec.overrides)} "
                         f"microbatch {micro} seq_len {spec.seq_len}")
