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

NOTE [concurrent profile]
`hetpart run` starts every rank of a node on that machine at once: preset:cpu-4
puts 4 one-thread ranks on this 2-core VM. Side by side they share the L3 cache
and memory bandwidth, and where there are more ranks than cores the kernel
switches between them mid-op, each coming back to caches the others filled: an
op costs a rank more CPU time than it costs a process alone (on an idle VM,
resnet's stages on cpu-2 took 1.3x the thread CPU time under torchrun that they
take alone, docs/benchmarks.md "Cost model"). `concurrent=N` (`hetpart profile
--concurrent N`, or `--cluster`: N = the ranks that will share the machine)
starts N-1 sibling processes before timing. Sibling k runs part k of N of the
graph (cut where the ops' times add up to equal shares, `_cut`), as the other
ranks run their stages, pass after pass, untimed, on its own copy of the
weights, until the timed passes are done; the timed process runs the whole
graph, as always. A rank is not busy all the time: in a GPipe step of M
microbatches over N stages it computes M of the M + N - 1 slots and waits
for its neighbours in the others, so each sibling computes that share of the
time and sleeps in between (`sibling_duty`: 0.8 for cpu-2, 0.57 for cpu-4 at
M = 4). Busy all the time, siblings made the profile 22-28% (gpt-small) and up
to 67% (resnet) slower than the torchrun ranks on cpu-4, on a loaded VM. The
siblings are plain subprocesses (`python -c`, the graph written as a `_Replay`
with ops by name, NOTE [replay files]), started, waited for (each prints
"ready" after its first pass) and reaped by `_Siblings`; one that fails stops
the profile with its error. The profile records `concurrent` and the passes
the siblings ran (`sibling_passes`).

NOTE [replay files]
A sibling gets its graph as two files, not a pickle (hetpart never unpickles,
tests/test_integrity.py): replay.safetensors holds every tensor (inputs,
weights, tensor constants in arguments; a tensor used twice, as tied weights
are, is stored once) and replay.json the rest, each value tagged by what it is:
{"slot": i} (the value node i made), {"tensor": key}, {"tuple": [...]} (a JSON
list is a list), {"dict": {...}}, {"dtype": "float32"}, {"device": "cpu"},
{"layout": ...}, {"memory_format": ...}, {"slice": [start, stop, step]},
{"float": "inf"} (and "-inf", "nan", which JSON cannot hold); None, bools, ints,
finite floats and strings as themselves. A step's target is {"op": [namespace,
name, overload]} (looked up in torch.ops) or {"fn": [module, name]}, a plain
function the sibling looks up only if `_replayable_fn` allows it: the
operator module's operators and math's functions (not attrgetter, methodcaller
and the like, which reach any attribute), a few builtins (int, float, min,
max...) and torch's sym_* functions, so the file cannot make it call anything
else. Any other value or target fails `hetpart profile --concurrent` with a
HetpartError before the siblings start, naming it: profile without --concurrent.
"""

from __future__ import annotations

import importlib
import json
import math
import operator
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from safetensors.torch import load_file, save_file

from hetpart.errors import HetpartError
from hetpart.fsio import atomic_write
from hetpart.passes.flops import has_floating

FORMAT_VERSION = 1


def ranks_sharing_a_machine(cluster: Any, device_type: str) -> int:
    """`hetpart profile --cluster`: the most devices of `device_type` on one machine of `cluster`, the
    ranks `hetpart run` starts side by side there (NOTE [concurrent profile]); 1 if it has none."""
    return max([sum(d.type.name == device_type for d in m.devices) for m in cluster.machines] + [1])


def sibling_duty(concurrent: int, microbatches: int) -> float:
    """The share of a pipeline step a rank computes forwards: M of the M + N - 1 slots of an N-stage
    GPipe step of M microbatches (NOTE [concurrent profile]); 1 without siblings."""
    return 1.0 if concurrent <= 1 else microbatches / (microbatches + concurrent - 1)


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
    concurrent: int = 1  # processes running the graph while it was timed (NOTE [concurrent profile])
    sibling_passes: int = 0  # passes the concurrent-1 siblings ran meanwhile, all together
    sibling_duty: float = 1.0  # the share of the time each sibling computed (`sibling_duty`)

    def to_json(self) -> dict:
        return {"format_version": FORMAT_VERSION, "device_type": self.device_type, "device": self.device,
                "threads": self.threads, "clock": self.clock, "concurrent": self.concurrent,
                "sibling_passes": self.sibling_passes, "sibling_duty": self.sibling_duty, "torch_version": torch.__version__,
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
        return Profile(data["device_type"], threads, data["forward_ns"], backward,
                       str(data.get("device", "cpu")), str(data.get("source", "")), str(data.get("clock", "wall")),
                       concurrent, passes, float(duty))


def check_output_path(path: Path) -> None:
    """`profile --out`: a file that can be written, checked before minutes of profiling."""
    if path.is_dir():
        raise HetpartError(f"--out {path} is a directory; give a file name, e.g. --out {path / 'profile.json'}")
    parent = path.parent
    if not parent.is_dir():
        what = "is a file" if parent.exists() else "does not exist"
        raise HetpartError(f"--out {path}: its folder {parent} {what}; create the folder or choose another --out")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise HetpartError(f"--out {path}: cannot write there (permission denied); choose another --out")


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


@dataclass(frozen=True)
class _Slot:
    """A graph value in a `_Replay`: the index of the node that made it."""

    index: int


_OPERATORS_NOT_REPLAYED = {"attrgetter", "itemgetter", "methodcaller", "call"}  # they reach any attribute
_BUILTINS_REPLAYED = {"abs", "bool", "divmod", "float", "int", "len", "max", "min", "pow", "round"}


def _replayable_fn(module: str, name: str) -> bool:
    """Whether a sibling may call function `name` of `module` by name (NOTE [replay files])."""
    if not isinstance(module, str) or not isinstance(name, str) or "." in name:
        return False
    if module in ("operator", "_operator"):
        return not name.startswith("_") and name not in _OPERATORS_NOT_REPLAYED
    if module == "math":
        return not name.startswith("_")
    if module == "builtins":
        return name in _BUILTINS_REPLAYED
    return module == "torch" and name.startswith(("sym_", "_sym_"))


def _resolve_fn(module: Any, name: Any) -> Any:
    if not _replayable_fn(module, name):
        raise HetpartError(f"--concurrent: a sibling process may not call {module}.{name} (NOTE [replay files] in "
                           "hetpart/passes/profile.py lists what it may); profile without --concurrent")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise HetpartError(f"--concurrent: {module}.{name} is not a function; profile without --concurrent")
    return fn


def _encode(value: Any, tensors: dict[int, tuple[str, torch.Tensor]]) -> Any:
    """`value` as replay.json holds it (NOTE [replay files]); its tensors go into `tensors` (id -> key, tensor)."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, _Slot):
        return {"slot": value.index}
    if isinstance(value, torch.Tensor):
        if id(value) not in tensors:
            copy = value.detach().to("cpu").clone(memory_format=torch.contiguous_format)
            tensors[id(value)] = (f"t{len(tensors)}", copy)
        return {"tensor": tensors[id(value)][0]}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, dict) and all(type(k) is str for k in value):
        return {"dict": {k: _encode(v, tensors) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [_encode(v, tensors) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    raise HetpartError(f"--concurrent: the graph holds a {type(value).__module__}.{type(value).__qualname__} "
                       f"({value!r:.80}), which a sibling process cannot be sent (NOTE [replay files]); "
                       "profile without --concurrent")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `_encode`."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (tag, x), = value.items()
        if tag == "slot" and type(x) is int:
            return _Slot(x)
        if tag == "tensor" and x in tensors:
            return tensors[x]
        if tag == "tuple" and isinstance(x, list):
            return tuple(_decode(v, tensors) for v in x)
        if tag == "dict" and isinstance(x, dict):
            return {k: _decode(v, tensors) for k, v in x.items()}
        if tag in ("dtype", "layout", "memory_format") and isinstance(x, str):
            kind = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}[tag]
            if isinstance(getattr(torch, x, None), kind):
                return getattr(torch, x)
        if tag == "device" and isinstance(x, str):
            return torch.device(x)
        if tag == "float" and x in ("inf", "-inf", "nan"):
            return float(x)
        if tag == "slice" and isinstance(x, list) and len(x) == 3:
            return slice(*(_decode(v, tensors) for v in x))
        if tag == "ellipsis" and x is True:
            return Ellipsis
    raise HetpartError(f"--concurrent: a replay file holds {value!r:.80}, which is no value it writes "
                       "(NOTE [replay files])")


@dataclass
class _Replay:
    """A graph as a sibling process runs it (NOTE [concurrent profile]): ops by name, no fx objects.

    Each step is (the slot it makes, target, args, kwargs, the slots freed after it), values
    as `_Slot`s; an OpOverload target is ("op", namespace, name, overload), resolved in the sibling.
    `save` and `load` write and read it as JSON and safetensors (NOTE [replay files]).
    """

    inputs: dict[int, Any]  # placeholder slot -> its tensor
    weights: dict[int, Any]  # get_attr slot -> its tensor
    steps: list[tuple[int, Any, Any, Any, tuple[int, ...]]]  # (slot, target, args, kwargs, freed)

    @staticmethod
    def of(gm: fx.GraphModule, weights: dict[fx.Node, Any], inputs: tuple) -> _Replay:
        index = {node: i for i, node in enumerate(gm.graph.nodes)}
        slot = lambda a: _Slot(index[a])  # noqa: E731
        frees = _frees(gm)
        steps = []
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            target = node.target
            if isinstance(target, torch._ops.OpOverload):
                target = ("op", target.namespace, target._schema.name.split("::")[-1], target._overloadname)
            steps.append((index[node], target, fx.node.map_arg(node.args, slot), fx.node.map_arg(node.kwargs, slot),
                          tuple(index[d] for d in frees.get(node, ()))))
        placeholders = gm.graph.find_nodes(op="placeholder")
        return _Replay({index[n]: x for n, x in zip(placeholders, inputs)},
                       {index[n]: w for n, w in weights.items()}, steps)

    def save(self, folder: Path) -> None:
        """Write replay.json and replay.safetensors into `folder` (NOTE [replay files])."""
        tensors: dict[int, tuple[str, torch.Tensor]] = {}
        steps = []
        for i, target, args, kwargs, freed in self.steps:
            if isinstance(target, tuple) and target and target[0] == "op":
                encoded: dict[str, Any] = {"op": list(target[1:])}
            else:
                module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
                if not _replayable_fn(module, name) or _resolve_fn(module, name) is not target:
                    raise HetpartError(f"--concurrent: the graph calls {_target_name(target)} ({module}), which a "
                                       "sibling process may not call (NOTE [replay files]); profile without "
                                       "--concurrent")
                encoded = {"fn": [module, name]}
            steps.append([i, encoded, _encode(args, tensors), _encode(kwargs, tensors), list(freed)])
        data = {"inputs": [[i, _encode(x, tensors)] for i, x in self.inputs.items()],
                "weights": [[i, _encode(w, tensors)] for i, w in self.weights.items()], "steps": steps}
        (folder / "replay.json").write_text(json.dumps(data, allow_nan=False))
        save_file({key: t for key, t in tensors.values()}, str(folder / "replay.safetensors"))

    @staticmethod
    def load(folder: Path) -> _Replay:
        """Read what `save` wrote into `folder`; calls nothing but ops and `_replayable_fn` functions."""
        tensors = load_file(str(folder / "replay.safetensors"))
        data = json.loads((folder / "replay.json").read_text())
        steps = []
        for i, target, args, kwargs, freed in data["steps"]:
            if set(target) == {"op"} and len(target["op"]) == 3 and all(isinstance(t, str) for t in target["op"]):
                resolved: Any = ("op", *target["op"])
            elif set(target) == {"fn"} and len(target["fn"]) == 2:
                resolved = _resolve_fn(*target["fn"])
            else:
                raise HetpartError(f"--concurrent: a replay file calls {target!r:.80}, which is no target it "
                                   "writes (NOTE [replay files])")
            steps.append((int(i), resolved, _decode(args, tensors), _decode(kwargs, tensors),
                          tuple(int(d) for d in freed)))
        return _Replay({int(i): _decode(x, tensors) for i, x in data["inputs"]},
                       {int(i): _decode(w, tensors) for i, w in data["weights"]}, steps)

    def compile(self, part: int = 0, parts: int = 1) -> Callable[[], dict[int, Any]]:
        """A pass over part `part` of `parts` (0-based) of the graph, cut where the ops' times, measured
        on a first full pass, add up to equal shares; the values it reads from before its part are
        kept from that pass. A pass returns the values by slot (freed ones gone)."""
        def resolve(target: Any) -> Any:
            if isinstance(target, tuple) and target and target[0] == "op":
                return getattr(getattr(getattr(torch.ops, target[1]), target[2]), target[3])
            return target

        steps = [(i, resolve(t), args, kwargs, freed) for i, t, args, kwargs, freed in self.steps]

        def load(value: Any, values: dict[int, Any]) -> Any:
            if isinstance(value, _Slot):
                return values[value.index]
            if isinstance(value, (tuple, list)):
                return type(value)(load(v, values) for v in value)
            if isinstance(value, dict):
                return {k: load(v, values) for k, v in value.items()}
            return value

        def run(todo: list, values: dict[int, Any], free: bool = True) -> list[int]:
            times_ns = []
            for i, target, args, kwargs, freed in todo:
                start = time.perf_counter_ns()
                values[i] = target(*load(args, values), **load(kwargs, values))
                times_ns.append(time.perf_counter_ns() - start)
                for d in freed if free else ():
                    values.pop(d, None)
            return times_ns

        first = {**self.weights, **{i: x.clone() for i, x in self.inputs.items()}}
        lo, hi = _cut(run(steps, first, free=False), parts)[part]
        mine = steps[lo:hi]
        made = {i for i, *_ in mine}
        before = {i: v for i, v in first.items() if i not in made}

        def one_pass() -> dict[int, Any]:
            values = dict(before)
            run(mine, values)
            return values
        return one_pass


def _cut(times_ns: list[int], parts: int) -> list[tuple[int, int]]:
    """Split steps with these times into `parts` contiguous [lo, hi) ranges of about equal total time:
    part k ends at the first step where the running total reaches (k + 1) / parts of the whole."""
    total, done, bounds = sum(times_ns), 0, [0]
    for k, ns in enumerate(times_ns):
        done += ns
        while len(bounds) < parts and done * parts >= total * len(bounds):
            bounds.append(k + 1)
    bounds += [len(times_ns)] * (parts + 1 - len(bounds))
    return list(zip(bounds, bounds[1:]))


def _frees(gm: fx.GraphModule) -> dict[fx.Node, list[fx.Node]]:
    """Node -> the values (not weights) whose last use it is (NOTE [profile passes])."""
    last_use: dict[fx.Node, fx.Node] = {}
    for node in reversed(gm.graph.nodes):
        for a in node.all_input_nodes:
            last_use.setdefault(a, node)
    freed_after: dict[fx.Node, list[fx.Node]] = {}
    for value_node, user in last_use.items():
        if value_node.op != "get_attr":
            freed_after.setdefault(user, []).append(value_node)
    return freed_after


def _sibling_main(replay_dir: str, threads: int, part: int, parts: int, duty: float = 1.0) -> None:
    """A sibling process (NOTE [concurrent profile]): replay its part of the graph until stdin closes,
    computing `duty` of the time (after a pass of t seconds it waits t * (1 - duty) / duty).

    Prints "ready" after its first pass and, when stdin closes (the profile is done, or the
    parent died), the number of passes it ran.
    """
    torch.set_num_threads(threads)
    with torch.no_grad():
        run = _Replay.load(Path(replay_dir)).compile(part, parts)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    passes = 0
    with torch.no_grad():
        run()
        print("ready", flush=True)
        while not stop.is_set():
            start = time.perf_counter()
            run()
            passes += 1
            if duty < 1:
                stop.wait((time.perf_counter() - start) * (1 - duty) / duty)
    print(f"passes {passes}", flush=True)


class _Siblings:
    """`count` sibling processes replaying `replay` while the profile times (NOTE [concurrent profile]).

    A context manager: entering starts them and waits until each has run one pass, leaving
    closes their stdin, waits for each to report its passes and exit, and kills one that
    does not within `stop_s`. `passes` is what they reported, all together.
    """

    def __init__(self, replay: _Replay | None, count: int, threads: int, parts: int | None = None,
                 duty: float = 1.0, start_s: float = 300, stop_s: float = 30) -> None:
        self.replay, self.count, self.threads, self.duty = replay, count, threads, duty
        self.parts = count + 1 if parts is None else parts  # sibling k runs part k + 1 of them
        self.start_s, self.stop_s = start_s, stop_s
        self.procs: list[subprocess.Popen] = []
        self.passes = 0
        self._dir: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> _Siblings:
        if self.count == 0:
            return self
        self._dir = tempfile.TemporaryDirectory(prefix="hetpart-profile-")
        path = Path(self._dir.name)
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the hetpart package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])]),
               "OMP_NUM_THREADS": str(self.threads)}
        try:
            assert self.replay is not None
            self.replay.save(path)
            for k in range(self.count):
                code = ("from hetpart.passes.profile import _sibling_main; "
                        f"_sibling_main({str(path)!r}, {self.threads}, {(k + 1) % self.parts}, {self.parts}, "
                        f"{self.duty!r})")
                with (Path(self._dir.name) / f"sibling{k}.err").open("w") as err:
                    self.procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.PIPE,
                                                       stdout=subprocess.PIPE, stderr=err, text=True))
            deadline = time.monotonic() + self.start_s
            for k, proc in enumerate(self.procs):
                line = ""
                while not line:
                    ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
                    if not ready:
                        raise HetpartError(f"--concurrent: sibling process {k + 1} did not finish a pass in "
                                           f"{self.start_s:g} s; profile with a smaller --concurrent")
                    line = proc.stdout.readline()
                    if not line:  # EOF: it died
                        raise HetpartError(f"--concurrent: sibling process {k + 1} failed (exit status "
                                           f"{proc.wait()}): {self._stderr(k)}")
                    if line.strip() != "ready":
                        line = ""
        except BaseException:
            self._reap()
            raise
        return self

    def _stderr(self, k: int) -> str:
        assert self._dir is not None
        lines = (Path(self._dir.name) / f"sibling{k}.err").read_text().strip().splitlines()
        return "\n".join(lines[-5:]) or "no output"

    def _reap(self) -> None:
        for proc in self.procs:
            if proc.stdin and not proc.stdin.closed:
                proc.stdin.close()
        deadline = time.monotonic() + self.stop_s
        for proc in self.procs:  # each writes a few bytes only: its stdout is read once it has exited
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out = proc.stdout.read()
            proc.stdout.close()
            self.passes += sum(int(w.split()[1]) for w in out.splitlines() if w.startswith("passes "))
        self.procs = []
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __exit__(self, *exc: object) -> None:
        self._reap()


def profile_graph(gm: fx.GraphModule, inputs: tuple, device_type: str, *, device: str = "cpu",
                  repeats: int = 20, warmup: int = 3, threads: int | None = None, source: str = "",
                  backward: bool = False, concurrent: int = 1, microbatches: int = 4) -> Profile:
    """Run `gm` on `inputs` (one microbatch) and time each op; see NOTE [profile passes].

    `warmup` untimed passes, then `repeats` timed passes over the whole graph; an op's time
    is the median over the timed passes (and over every node with its key). The graph's
    weights and inputs are moved to `device`. With `backward`, every op whose output needs a
    gradient (NOTE [backward formulas] in flops.py) also has its backward timed
    (NOTE [backward timing]) under `backward_key`. With `concurrent` N > 1, N-1 sibling
    processes run the graph meanwhile, each busy as a rank of an N-stage GPipe pipeline of
    `microbatches` per step is (NOTE [concurrent profile]).
    """
    if repeats < 1 or warmup < 0:
        raise HetpartError(f"--repeats must be >= 1 (got {repeats})")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise HetpartError("--device cuda: CUDA is not available on this machine; use --device cpu")
    if concurrent < 1 or (concurrent > 1 and dev.type != "cpu"):
        raise HetpartError(f"--concurrent {concurrent}: expected 1 or more processes, and more than 1 only with "
                           "--device cpu (the ranks that share this machine's cores)")
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
    freed_after = _frees(gm)
    duty = sibling_duty(concurrent, microbatches)
    siblings = _Siblings(_Replay.of(gm, weights, inputs) if concurrent > 1 else None, concurrent - 1, threads,
                         duty=duty)
    try:
        siblings.__enter__()
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
        siblings.__exit__()
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
                   clock="thread_cpu" if clock is time.thread_time_ns else "wall", concurrent=concurrent,
                   sibling_passes=siblings.passes, sibling_duty=duty)


def profile_model(spec: Any, microbatches: int, device_type: str, *, device: str = "cpu", repeats: int = 20,
                  warmup: int = 3, threads: int | None = None, backward: bool = False,
                  concurrent: int = 1) -> Profile:
    """`hetpart profile`: build and export `spec` (a ModelSpec) as `partition` does, then `profile_graph`
    at the microbatch size `spec.batch_size / microbatches` on the model's own example inputs."""
    from hetpart.frontend import export_model, load_model  # the frontend sits beside passes, not below

    if microbatches < 1 or spec.batch_size % microbatches:
        raise HetpartError(f"--microbatches {microbatches} must be >= 1 and divide --batch-size {spec.batch_size}")
    module, inputs = load_model(spec)
    gm = export_model(module, inputs)
    micro = spec.batch_size // microbatches
    return profile_graph(gm, tuple(x[:micro] for x in inputs), device_type, device=device, repeats=repeats,
                         warmup=warmup, threads=threads, backward=backward, concurrent=concurrent,
                         microbatches=microbatches,
                         source=f"{spec.model} {dict(spec.overrides)} "
                         f"microbatch {micro} seq_len {spec.seq_len}")
