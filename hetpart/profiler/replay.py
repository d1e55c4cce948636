"""A graph as a sibling process replays it: ops by name, values by slot, no fx objects, no pickle.

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
function the sibling looks up only if `replayable_fn` allows it: the
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from safetensors.torch import load_file, save_file

from hetpart.errors import HetpartError
from hetpart.profiler.table import target_name


@dataclass(frozen=True)
class Slot:
    """A graph value in a `Replay`: the index of the node that made it."""

    index: int


_OPERATORS_NOT_REPLAYED = {"attrgetter", "itemgetter", "methodcaller", "call"}  # they reach any attribute
_BUILTINS_REPLAYED = {"abs", "bool", "divmod", "float", "int", "len", "max", "min", "pow", "round"}


def replayable_fn(module: str, name: str) -> bool:
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
    if not replayable_fn(module, name):
        raise HetpartError(f"--concurrent: a sibling process may not call {module}.{name} (NOTE [replay files] in "
                           "hetpart/profiler/replay.py lists what it may); profile without --concurrent")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise HetpartError(f"--concurrent: {module}.{name} is not a function; profile without --concurrent")
    return fn


def encode_value(value: Any, tensors: dict[int, tuple[str, torch.Tensor]]) -> Any:
    """`value` as replay.json holds it (NOTE [replay files]); its tensors go into `tensors` (id -> key, tensor)."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, Slot):
        return {"slot": value.index}
    if isinstance(value, torch.Tensor):
        if id(value) not in tensors:
            copy = value.detach().to("cpu").clone(memory_format=torch.contiguous_format)
            tensors[id(value)] = (f"t{len(tensors)}", copy)
        return {"tensor": tensors[id(value)][0]}
    if isinstance(value, tuple):
        return {"tuple": [encode_value(v, tensors) for v in value]}
    if isinstance(value, list):
        return [encode_value(v, tensors) for v in value]
    if isinstance(value, dict) and all(type(k) is str for k in value):
        return {"dict": {k: encode_value(v, tensors) for k, v in value.items()}}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, slice):
        return {"slice": [encode_value(v, tensors) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"ellipsis": True}
    raise HetpartError(f"--concurrent: the graph holds a {type(value).__module__}.{type(value).__qualname__} "
                       f"({value!r:.80}), which a sibling process cannot be sent (NOTE [replay files]); "
                       "profile without --concurrent")


def decode_value(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of `encode_value`."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if isinstance(value, list):
        return [decode_value(v, tensors) for v in value]
    if isinstance(value, dict) and len(value) == 1:
        (tag, x), = value.items()
        if tag == "slot" and type(x) is int:
            return Slot(x)
        if tag == "tensor" and x in tensors:
            return tensors[x]
        if tag == "tuple" and isinstance(x, list):
            return tuple(decode_value(v, tensors) for v in x)
        if tag == "dict" and isinstance(x, dict):
            return {k: decode_value(v, tensors) for k, v in x.items()}
        if tag in ("dtype", "layout", "memory_format") and isinstance(x, str):
            kind = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}[tag]
            if isinstance(getattr(torch, x, None), kind):
                return getattr(torch, x)
        if tag == "device" and isinstance(x, str):
            return torch.device(x)
        if tag == "float" and x in ("inf", "-inf", "nan"):
            return float(x)
        if tag == "slice" and isinstance(x, list) and len(x) == 3:
            return slice(*(decode_value(v, tensors) for v in x))
        if tag == "ellipsis" and x is True:
            return Ellipsis
    raise HetpartError(f"--concurrent: a replay file holds {value!r:.80}, which is no value it writes "
                       "(NOTE [replay files])")


@dataclass
class Replay:
    """A graph as a sibling process runs it (NOTE [concurrent profile]): ops by name, no fx objects.

    Each step is (the slot it makes, target, args, kwargs, the slots freed after it), values
    as `Slot`s; an OpOverload target is ("op", namespace, name, overload), resolved in the sibling.
    `save` and `load` write and read it as JSON and safetensors (NOTE [replay files]).
    """

    inputs: dict[int, Any]  # placeholder slot -> its tensor
    weights: dict[int, Any]  # get_attr slot -> its tensor
    steps: list[tuple[int, Any, Any, Any, tuple[int, ...]]]  # (slot, target, args, kwargs, freed)

    @staticmethod
    def of(gm: fx.GraphModule, weights: dict[fx.Node, Any], inputs: tuple) -> Replay:
        index = {node: i for i, node in enumerate(gm.graph.nodes)}
        slot = lambda a: Slot(index[a])  # noqa: E731
        frees = values_freed_after(gm)
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
        return Replay({index[n]: x for n, x in zip(placeholders, inputs)},
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
                if not replayable_fn(module, name) or _resolve_fn(module, name) is not target:
                    raise HetpartError(f"--concurrent: the graph calls {target_name(target)} ({module}), which a "
                                       "sibling process may not call (NOTE [replay files]); profile without "
                                       "--concurrent")
                encoded = {"fn": [module, name]}
            steps.append([i, encoded, encode_value(args, tensors), encode_value(kwargs, tensors), list(freed)])
        data = {"inputs": [[i, encode_value(x, tensors)] for i, x in self.inputs.items()],
                "weights": [[i, encode_value(w, tensors)] for i, w in self.weights.items()], "steps": steps}
        (folder / "replay.json").write_text(json.dumps(data, allow_nan=False))
        save_file({key: t for key, t in tensors.values()}, str(folder / "replay.safetensors"))

    @staticmethod
    def load(folder: Path) -> Replay:
        """Read what `save` wrote into `folder`; calls nothing but ops and `replayable_fn` functions."""
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
            steps.append((int(i), resolved, decode_value(args, tensors), decode_value(kwargs, tensors),
                          tuple(int(d) for d in freed)))
        return Replay({int(i): decode_value(x, tensors) for i, x in data["inputs"]},
                       {int(i): decode_value(w, tensors) for i, w in data["weights"]}, steps)

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
            if isinstance(value, Slot):
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
        lo, hi = cut(run(steps, first, free=False), parts)[part]
        mine = steps[lo:hi]
        made = {i for i, *_ in mine}
        before = {i: v for i, v in first.items() if i not in made}

        def one_pass() -> dict[int, Any]:
            values = dict(before)
            run(mine, values)
            return values
        return one_pass


def cut(times_ns: list[int], parts: int) -> list[tuple[int, int]]:
    """Split steps with these times into `parts` contiguous [lo, hi) ranges of about equal total time:
    part k ends at the first step where the running total reaches (k + 1) / parts of the whole."""
    total, done, bounds = sum(times_ns), 0, [0]
    for k, ns in enumerate(times_ns):
        done += ns
        while len(bounds) < parts and done * parts >= total * len(bounds):
            bounds.append(k + 1)
    bounds += [len(times_ns)] * (parts + 1 - len(bounds))
    return list(zip(bounds, bounds[1:]))


def values_freed_after(gm: fx.GraphModule) -> dict[fx.Node, list[fx.Node]]:
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
