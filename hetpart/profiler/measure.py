"""Measured op times on the local device: `hetpart profile`.

`profile_graph` runs an exported graph on real tensors at the microbatch size,
pass after pass (warm-up passes, then timed ones), with the thread count a
runtime rank uses, and records each op's median time under its `op_key`
(NOTE [profile keys] in profiler/table.py).

NOTE [profile passes]
Ops are timed where they run: each timed pass runs the whole graph in order
and times every op inside it, so an op meets the caches as a real forward
leaves them (a weight bigger than the caches comes from memory, as it does
in a stage), and each value is freed after its last use, as the stage's
generated code does, so the allocator hands out the same warm memory. Timing
one op many times in a row would keep its weights cache-hot and read it faster
than the forward runs it (by how much: docs/benchmarks.md, "Measurements moved
out of NOTEs").

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
so a profile taken on a busy machine matches one taken on an idle one (as
measured: docs/benchmarks.md, "Measurements moved out of NOTEs"). With several threads, or on CUDA
(synchronised), it is wall time. The profile records which (`clock`).

NOTE [profile threads]
`hetpart run` starts one process per stage with OMP_NUM_THREADS=1 unless the
environment sets it (runtime/launch.py), so each rank computes with that many
threads; the profile measures with the same count (`runtime_threads`) and
records it. A profile is only as good as its match to the runtime: measure on
the machine (and load) the plan is for.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.frontend import export_model, load_model
from hetpart.passes.flops import has_floating
from hetpart.profiler.replay import Replay, values_freed_after
from hetpart.profiler.siblings import Siblings, sibling_duty
from hetpart.profiler.table import Profile, backward_key, op_key, profiled


def check_profile_type(name: str, cluster: Any = None) -> None:
    """`hetpart profile --device-type`: a type of the catalog, or one of `cluster`'s own types
    (its [[device_types]] tables, where the cluster is given); otherwise an error listing both."""
    from hetpart.devices import CATALOG

    custom = sorted(set(cluster.device_types) - set(CATALOG)) if cluster is not None else []
    if name in CATALOG or name in custom:
        used = sorted({d.type.name for m in cluster.machines for d in m.devices}) if cluster is not None else [name]
        if name not in used:  # review22: was profiled as 1 process, a profile `partition --cluster` then refuses
            raise HetpartError(f"--device-type {name}: cluster '{cluster.name}' has no device of that type (its "
                               f"devices: {', '.join(used)}); --cluster counts the ranks of the type that share a "
                               "machine, and `partition --cluster` takes only profiles of its own types: give the "
                               "cluster you will partition for, or --concurrent N instead of --cluster")
        return
    where = (f"; cluster '{cluster.name}' adds: {', '.join(custom)}" if custom else
             f"; cluster '{cluster.name}' adds none" if cluster is not None else
             "; a cluster's own [[device_types]] need --cluster FILE")
    raise HetpartError(f"--device-type: unknown device type '{name}' (catalog: {', '.join(sorted(CATALOG))}{where}); "
                       "see `hetpart devices`")


def runtime_threads() -> int:
    """Threads per rank under `hetpart run` (NOTE [profile threads])."""
    return int(os.environ.get("OMP_NUM_THREADS", "1"))


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
    freed_after = values_freed_after(gm)
    duty = sibling_duty(concurrent, microbatches)
    siblings = Siblings(Replay.of(gm, weights, inputs) if concurrent > 1 else None, concurrent - 1, threads,
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
    if microbatches < 1 or spec.batch_size % microbatches:
        raise HetpartError(f"--microbatches {microbatches} must be >= 1 and divide --batch-size {spec.batch_size}")
    module, inputs = load_model(spec)
    if any(p.is_meta for p in module.parameters()):  # review22: was torch.export's "not on the expected device meta"
        raise HetpartError(f"{spec.model} is built on the meta device only (its weights are never made: a meta-only "
                           "zoo model, see `hetpart models`), and `hetpart profile` times ops on real weights: profile "
                           "its family with real weights and fewer layers (zoo:llama with the same --set dims and "
                           "--set n_layers=1, say); a profile is keyed by op and input shapes, so one layer's ops "
                           "serve every layer of the big model")
    gm = export_model(module, inputs)
    micro = spec.batch_size // microbatches
    return profile_graph(gm, tuple(x[:micro] for x in inputs), device_type, device=device, repeats=repeats,
                         warmup=warmup, threads=threads, backward=backward, concurrent=concurrent,
                         microbatches=microbatches,
                         source=f"{spec.model} {dict(spec.overrides)} "
                         f"microbatch {micro} seq_len {spec.seq_len}")
