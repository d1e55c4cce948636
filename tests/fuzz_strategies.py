"""Hypothesis strategies for the fuzz tests: random DAG models and random clusters.

A model is a `NetSpec`: inputs, then ops over earlier values (linear, conv, flatten,
elementwise, binary add/mul, concat, split, residual add, a linear reused (tied weights),
ops on a weight alone, views and factory ops sized by the symbolic batch), then the
values it returns (an input, or one value twice, included).
`FuzzNet` interprets it, so torch.export traces one straight-line graph per spec.
A cluster is TOML text (catalog device types, 1-4 devices on 1-2 machines, random
capacities and links), parsed by hetpart.devices like a user's file.

Shapes stay small (batch 4, at most 12 features, 4x4 images): the properties are
about graph structure, and 200 examples must run in about a minute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from torch import nn

BATCH = 4
IMAGE_HW = 4
DEVICE_TYPES = ("a100-80g", "t4-16g", "v100-32g", "l4-24g", "cpu")


@dataclass(frozen=True)
class Value:
    """A tensor in the spec: [BATCH, size] ("vec") or [BATCH, size, 4, 4] ("img")."""

    kind: str
    size: int


@dataclass(frozen=True)
class Op:
    """`kind` applied to the values `args` (indices into the values so far); makes one value, or two (split)."""

    kind: str  # linear, conv, flatten, reshape, relu, tanh, sigmoid, scale, softmax, add, mul, concat, split,
    #            residual, tied (an earlier linear again), const (+ a function of a weight only), zeros
    args: tuple[int, ...]
    size: int = 0  # linear/conv/tied: output features or channels; split: the first part's size
    ref: int = 0  # tied: the index of the linear op whose weights it reuses


@dataclass(frozen=True)
class NetSpec:
    inputs: tuple[Value, ...]
    ops: tuple[Op, ...]
    outputs: tuple[int, ...]  # value indices (an input, or one value twice, are allowed)

    def values(self) -> list[Value]:
        """Every value's kind and size: the inputs, then each op's results in order."""
        values = list(self.inputs)
        for op in self.ops:
            values.extend(_results(op, values))
        return values


def _results(op: Op, values: list[Value]) -> list[Value]:
    first = values[op.args[0]]
    if op.kind in ("linear", "tied"):
        return [Value("vec", op.size)]
    if op.kind == "conv":
        return [Value("img", op.size)]
    if op.kind in ("flatten", "reshape"):
        return [Value("vec", first.size * IMAGE_HW * IMAGE_HW)]
    if op.kind == "zeros":
        return [Value(first.kind, first.size + 2)]
    if op.kind == "concat":
        return [Value(first.kind, first.size + values[op.args[1]].size)]
    if op.kind == "split":
        return [Value(first.kind, op.size), Value(first.kind, first.size - op.size)]
    return [first]  # elementwise, add, mul, residual: the shape of the first argument


class _Bias(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.randn(size))


class FuzzNet(nn.Module):
    """Runs a NetSpec: one submodule per linear, conv and residual op."""

    def __init__(self, spec: NetSpec) -> None:
        super().__init__()
        self.spec = spec
        values = list(spec.inputs)
        self.layers = nn.ModuleDict()
        for i, op in enumerate(spec.ops):
            first = values[op.args[0]]
            if op.kind == "linear":
                self.layers[str(i)] = nn.Linear(first.size, op.size)
            elif op.kind == "conv":
                self.layers[str(i)] = nn.Conv2d(first.size, op.size, 3, padding=1)
            elif op.kind == "residual":  # x + f(x), f a linear or 1x1 conv of the same width
                self.layers[str(i)] = (nn.Linear(first.size, first.size) if first.kind == "vec"
                                       else nn.Conv2d(first.size, first.size, 1))
            elif op.kind == "const":  # x + tanh(2 p): ops on a weight only, recomputed by every stage that reads it
                self.layers[str(i)] = _Bias(first.size if first.kind == "vec" else 1)
            values.extend(_results(op, values))

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = list(inputs)
        for i, op in enumerate(self.spec.ops):
            xs = [values[a] for a in op.args]
            if op.kind in ("linear", "conv"):
                values.append(self.layers[str(i)](xs[0]))
            elif op.kind == "residual":
                values.append(xs[0] + self.layers[str(i)](xs[0]))
            elif op.kind == "tied":  # the weights of op `size` used again (a tied embedding / head)
                values.append(self.layers[str(op.ref)](xs[0]))
            elif op.kind == "const":
                values.append(xs[0] + torch.tanh(self.layers[str(i)].p * 2))
            elif op.kind == "reshape":  # a view sized by the (symbolic) batch
                values.append(xs[0].reshape(xs[0].shape[0], -1))
            elif op.kind == "zeros":  # a factory op sized by the (symbolic) batch
                pad = torch.zeros((xs[0].shape[0], 2, *xs[0].shape[2:]), dtype=xs[0].dtype)
                values.append(torch.cat([xs[0], pad], dim=1))
            elif op.kind == "softmax":
                values.append(torch.softmax(xs[0], dim=1))
            elif op.kind == "flatten":
                values.append(xs[0].flatten(1))
            elif op.kind == "relu":
                values.append(torch.relu(xs[0]))
            elif op.kind == "tanh":
                values.append(torch.tanh(xs[0]))
            elif op.kind == "sigmoid":
                values.append(torch.sigmoid(xs[0]))
            elif op.kind == "scale":
                values.append(xs[0] * 0.5)
            elif op.kind == "add":
                values.append(xs[0] + xs[1])
            elif op.kind == "mul":
                values.append(xs[0] * xs[1])
            elif op.kind == "concat":
                values.append(torch.cat(xs, dim=1))
            elif op.kind == "split":
                first, second = torch.split(xs[0], [op.size, xs[0].shape[1] - op.size], dim=1)
                values.extend([first, second])
            else:
                raise ValueError(f"unknown op {op.kind}")
        return tuple(values[k] for k in self.spec.outputs)


def example_inputs(spec: NetSpec, seed: int, batch: int = BATCH) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn((batch, v.size) if v.kind == "vec" else (batch, v.size, IMAGE_HW, IMAGE_HW),
                             generator=generator) for v in spec.inputs)


def build(spec: NetSpec, seed: int) -> tuple[FuzzNet, tuple[torch.Tensor, ...]]:
    torch.manual_seed(seed)
    return FuzzNet(spec).eval(), example_inputs(spec, seed)


@st.composite
def net_specs(draw: st.DrawFn, max_ops: int = 10) -> NetSpec:
    """A random DAG: every op reads earlier values, so any order of draws is a valid graph."""
    sizes = st.integers(2, 8)
    inputs = tuple(draw(st.lists(st.builds(Value, st.sampled_from(["vec", "img"]), st.integers(1, 4)),
                                 min_size=1, max_size=2)))
    values = list(inputs)
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, max_ops))):
        # Recent values are likelier operands: long chains and skips both appear.
        pick = st.integers(0, len(values) - 1).map(lambda k, n=len(values): max(k, n - 1 - k))
        a = draw(pick)
        x = values[a]
        same = [i for i, v in enumerate(values) if v == x]
        same_kind = [i for i, v in enumerate(values) if v.kind == x.kind]
        kinds = ["linear" if x.kind == "vec" else "conv", "relu", "tanh", "sigmoid", "scale", "softmax", "add",
                 "mul", "concat", "residual", "const", "zeros"]
        tied = [i for i, o in enumerate(ops) if o.kind == "linear" and values[o.args[0]] == x]
        if tied:
            kinds.append("tied")
        if x.kind == "img":
            kinds += ["flatten", "reshape"]
        if x.size >= 2:
            kinds.append("split")
        kind = draw(st.sampled_from(kinds))
        if kind in ("linear", "conv"):
            op = Op(kind, (a,), draw(sizes))
        elif kind in ("add", "mul"):
            op = Op(kind, (a, draw(st.sampled_from(same))))
        elif kind == "concat":
            b = draw(st.sampled_from(same_kind))
            if x.kind == "vec" and x.size + values[b].size > 12 or x.kind == "img" and x.size + values[b].size > 6:
                op = Op("relu", (a,))  # keep the shapes small
            else:
                op = Op(kind, (a, b))
        elif kind == "split":
            op = Op(kind, (a,), draw(st.integers(1, x.size - 1)))
        elif kind == "tied":
            ref = draw(st.sampled_from(tied))
            op = Op(kind, (a,), ops[ref].size, ref)
        elif kind in ("flatten", "reshape") and x.size * IMAGE_HW * IMAGE_HW > 48 or kind == "zeros" and x.size > 10:
            op = Op("relu", (a,))
        else:
            op = Op(kind, (a,))
        ops.append(op)
        values.extend(_results(op, values))
    # The last value and up to two others: any value, an input or a repeat included.
    extra = draw(st.lists(st.integers(0, len(values) - 1), max_size=2))
    outputs = (len(values) - 1, *extra)
    return NetSpec(inputs, tuple(ops), outputs)


@st.composite
def cluster_tomls(draw: st.DrawFn) -> str:
    """Cluster TOML: 1-4 devices of catalog types on 1-2 machines, random memory and links."""
    n_devices = draw(st.integers(1, 4))
    n_machines = draw(st.integers(1, min(2, n_devices)))
    machines: list[list[str]] = [[] for _ in range(n_machines)]
    for k in range(n_devices):
        machine = k if k < n_machines else draw(st.integers(0, n_machines - 1))
        kind = draw(st.sampled_from(DEVICE_TYPES))
        # Mostly ample memory; now and then tight (tens of KB), where the memory constraints bind.
        mem_gb = draw(st.one_of(st.just(None), st.sampled_from([0.000001, 0.000003, 0.00001, 1.0])))
        machines[machine].append(f'"{kind}"' if mem_gb is None else f'{{type = "{kind}", mem_GB = {mem_gb}}}')
    bandwidths = st.sampled_from([0.1, 1.0, 12.5, 300.0])
    latencies = st.sampled_from([0.0, 2.0, 50.0])
    lines = [f"[network]\nbandwidth_GBps = {draw(bandwidths)}\nlatency_us = {draw(latencies)}\n"]
    for i, devices in enumerate(machines):
        lines.append(f'[[nodes]]\nname = "m{i}"\ndevices = [{", ".join(devices)}]\n'
                     f"link = {{ bandwidth_GBps = {draw(bandwidths)}, latency_us = {draw(latencies)} }}\n")
    return "\n".join(lines)


@st.composite
def contiguous_plans(draw: st.DrawFn, graph, max_stages: int = 4) -> dict[str, int]:
    """A random valid stage assignment of a Problem's graph: one topological order cut into runs.

    Pinned nodes (the model's inputs and outputs) go to the first and last stage.
    """
    import networkx as nx

    order = list(nx.lexicographical_topological_sort(graph))
    num_stages = draw(st.integers(1, min(max_stages, len(order))))
    cuts = sorted(draw(st.lists(st.integers(1, len(order) - 1), min_size=num_stages - 1,
                                max_size=num_stages - 1, unique=True))) if len(order) > 1 else []
    stage_of = {v: sum(i >= c for c in cuts) for i, v in enumerate(order)}
    last = max(stage_of.values())
    for v, pin in graph.nodes(data="pin"):
        if pin == "first":
            stage_of[v] = 0
        elif pin == "last":
            stage_of[v] = last
    used = sorted(set(stage_of.values()))  # pins may leave a stage empty: renumber
    return {v: used.index(s) for v, s in stage_of.items()}
