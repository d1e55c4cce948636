"""A profile's tensor-parallel entries: each op timed as a rank of a TP group runs it (`profile --tensor-parallel T`).

NOTE [tensor-parallel profile]
A TP group's ranks run the same ops at the same moment: between two all-reduces rank r and its
peers compute the same op on shards of one size, in lockstep, each on a core of its own (on
this 2-core VM, the two ranks of preset:cpu-2). Beside each other they contend for the memory
system (a lone linear ran up to 79% slower with a memory copy on the other core:
docs/benchmarks.md, "where a stage's missing CPU goes"), which neither a profile taken alone nor
NOTE [concurrent profile]'s siblings (another part of the graph at a pipeline rank's duty)
reproduce; and a matmul at half its width need not take the roofline's share of its whole time.
So `hetpart profile --tensor-parallel T` also times the graph as rank 0 of T runs it:
- the rank's graph is codegen's (`shard_stage` of the whole model as one stage: split weights
  at their shard, head counts divided), with Megatron's f and g left out (the collectives are
  priced by the link, NOTE [tensor-parallel costs]) and an all-gather replaced by a cat;
- T-1 lockstep siblings (`lockstep_main`, plain subprocesses started by `Siblings`, the graph
  sent as a `Replay`, NOTE [replay files]) run that same graph; every process waits for the
  others before each op (`Lockstep`, a barrier spun on shared memory, outside the timed
  region), so each op is timed while its peers run that same op;
- each op's time is recorded under its key in the *whole* model (NOTE [profile keys]: the key
  the op-cost pass computes, at the microbatch size) and its role (`ShardingPlan.role`: row,
  split, whole), the median over the timed passes and the nodes sharing both; a row linear's
  time includes its bias, added after the all-reduce.
The profile stores them as `tp_forward_ns[T][role][key]`; the op-cost pass copies an op's into
`NodeInfo.tp_cost_ns`, and NOTE [tensor-parallel costs] uses them in place of its scaling
(forward only: backward keeps the scaling). A profile without them prices TP ranks as before.
The ordinary entries of the same profile are timed as before (NOTE [concurrent profile]).
"""

from __future__ import annotations

import mmap
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.profiler.replay import Replay, values_freed_after
from hetpart.profiler.table import op_key, profiled

aten = torch.ops.aten


class Lockstep:
    """A barrier of `parties` processes of one machine over a shared file (NOTE [tensor-parallel profile]): slot k
    counts party k's arrivals, the last slot is a stop flag."""

    def __init__(self, path: Path, parties: int, index: int, timeout_s: float = 120) -> None:
        self._file = open(path, "r+b")
        self._mm = mmap.mmap(self._file.fileno(), 8 * (parties + 1))
        self.parties, self.index, self.arrived, self.timeout_s = parties, index, 0, timeout_s
        self._format = f"<{parties + 1}q"

    @staticmethod
    def create(path: Path, parties: int) -> None:
        path.write_bytes(bytes(8 * (parties + 1)))

    def arrive(self) -> bool:
        """Wait until every party has arrived as often as this one; False once the barrier is stopped."""
        self.arrived += 1
        struct.pack_into("<q", self._mm, 8 * self.index, self.arrived)
        spins, deadline = 0, time.monotonic() + self.timeout_s
        while True:
            *counts, stop = struct.unpack_from(self._format, self._mm, 0)
            if stop:
                return False
            if min(counts) >= self.arrived:
                return True
            spins += 1
            if spins % 4096 == 0 and time.monotonic() > deadline:
                raise HetpartError(f"--tensor-parallel: a lockstep process did not reach op {self.arrived} in "
                                   f"{self.timeout_s:g} s; profile without --tensor-parallel")

    def stop(self) -> None:
        struct.pack_into("<q", self._mm, 8 * self.parties, 1)

    def close(self) -> None:
        self._mm.close()
        self._file.close()


class _Stopped(Exception):
    pass


def lockstep_main(replay_dir: str, threads: int, barrier: str, index: int, parties: int) -> None:
    """A lockstep sibling (NOTE [tensor-parallel profile]): the rank's graph, pass after pass, each op after the
    barrier, until it is stopped. Prints "ready" before its first wait and the passes it ran at the end."""
    torch.set_num_threads(threads)
    step = Lockstep(Path(barrier), parties, index)

    def wait() -> None:
        if not step.arrive():
            raise _Stopped

    with torch.no_grad():
        run = Replay.load(Path(replay_dir)).compile(before_step=wait)
    print("ready", flush=True)
    passes = 0
    try:
        with torch.no_grad():
            while True:
                run()
                passes += 1
    except _Stopped:
        pass
    step.close()
    print(f"passes {passes}", flush=True)


def rank_graph(gm: fx.GraphModule, plan: Any) -> tuple[fx.GraphModule, dict[str, str]]:
    """Rank 0's graph of `gm` run whole as one stage at `plan` (codegen's `shard_stage`), its collectives left
    out (an all-gather made a cat), and the node each inserted op is charged to (a row linear's bias add)."""
    from hetpart.codegen.split import split_stages
    from hetpart.codegen.tp import TP_FUNCTIONS, shard_stage

    (stage,) = split_stages(gm, {n.name: 0 for n in gm.graph.nodes}, 1)
    rank = shard_stage(stage, plan, 0).gm
    names = {n.name for n in gm.graph.nodes}
    charged: dict[str, str] = {}
    for node in list(rank.graph.nodes):
        if node.target in (TP_FUNCTIONS["tp_copy"], TP_FUNCTIONS["tp_all_reduce"]):
            if node.target is TP_FUNCTIONS["tp_all_reduce"]:
                charged.update({u.name: node.args[0].name for u in node.users if u.name not in names})
            node.replace_all_uses_with(node.args[0])
            rank.graph.erase_node(node)
        elif node.target is TP_FUNCTIONS["tp_all_gather"]:
            with rank.graph.inserting_before(node):
                cat = rank.graph.call_function(aten.cat.default, ([node.args[0]] * plan.degree, node.args[1]))
            node.replace_all_uses_with(cat)
            rank.graph.erase_node(node)
    rank.recompile()
    return rank, charged


def _whole_keys(gm: fx.GraphModule, inputs: tuple) -> dict[str, str]:
    """FX node name -> its profile key in the whole model at these inputs (NOTE [profile keys])."""
    values: dict[fx.Node, Any] = {}
    placeholders = iter(inputs)
    keys = {}
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                values[node] = next(placeholders)
            elif node.op == "get_attr":
                values[node] = _attr(gm, node.target)
            elif node.op == "call_function":
                values[node] = node.target(*fx.node.map_arg(node.args, values.__getitem__),
                                           **fx.node.map_arg(node.kwargs, values.__getitem__))
                if profiled(node):
                    keys[node.name] = op_key(node, values)
    return keys


def _attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def profile_tensor_parallel(gm: fx.GraphModule, inputs: tuple, degree: int, *, batch_size: int, threads: int,
                            repeats: int, warmup: int) -> dict[str, dict[str, int]]:
    """Role -> whole op's key -> its median time (ns, this thread's CPU time) as rank 0 of `degree` runs it beside
    its lockstep peers (NOTE [tensor-parallel profile]); `inputs` one microbatch of `gm` (exported, real weights)."""
    from hetpart.passes import PassContext, PassManager, ShapePass
    from hetpart.passes.tensor_parallel import TP_META, TensorParallelPass
    from hetpart.profiler.measure import op_clock
    from hetpart.profiler.siblings import Siblings

    micro = int(inputs[0].shape[0]) if inputs and isinstance(inputs[0], torch.Tensor) else batch_size
    ctx = PassContext(batch_size=batch_size, microbatch_size=micro)
    gm = PassManager([ShapePass(), TensorParallelPass((degree,))]).run(gm, ctx)
    plan = gm.meta[TP_META][degree]
    if not plan.regions:
        raise HetpartError(f"--tensor-parallel {degree}: the sharding found no linear pair to split in this model "
                           "(NOTE [tensor-parallel sharding]); profile without --tensor-parallel")
    keys = _whole_keys(gm, inputs)
    rank, charged = rank_graph(gm, plan)
    weights = {n: _attr(rank, n.target) for n in rank.graph.find_nodes(op="get_attr")}
    freed_after = values_freed_after(rank)
    clock = op_clock(torch.device("cpu"), threads)
    samples: dict[tuple[str, str], list[int]] = {}
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="hetpart-tp-profile-") as tmp:
        barrier = Path(tmp) / "lockstep"
        Lockstep.create(barrier, degree)
        me = Lockstep(barrier, degree, 0)
        try:
            with Siblings(Replay.of(rank, weights, inputs), degree - 1, threads, lockstep=barrier):
                try:
                    for index in range(warmup + repeats):
                        this_pass = _one_pass(rank, weights, inputs, me, clock, charged, freed_after)
                        if index >= warmup:
                            for name, ns in this_pass.items():
                                if name in keys:
                                    samples.setdefault((plan.role(name), keys[name]), []).append(ns)
                finally:
                    me.stop()
        finally:
            me.close()
            torch.set_num_threads(old_threads)
    tables: dict[str, dict[str, int]] = {}
    for (role, key), ns in sorted(samples.items()):
        tables.setdefault(role, {})[key] = int(statistics.median(ns))
    return tables


def _one_pass(rank: fx.GraphModule, weights: dict, inputs: tuple, me: Lockstep, clock: Any,
              charged: dict[str, str], freed_after: dict) -> dict[str, int]:
    """One timed pass of the rank's graph, each op after the barrier: FX node name (of the whole model) -> ns."""
    values: dict[fx.Node, Any] = dict(weights)
    placeholders = iter(inputs)
    times: dict[str, int] = {}
    with torch.no_grad():
        for node in rank.graph.nodes:
            if node.op == "placeholder":
                values[node] = next(placeholders)
            if node.op != "call_function":
                continue
            args = fx.node.map_arg(node.args, values.__getitem__)
            kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
            if not me.arrive():
                raise HetpartError("--tensor-parallel: the lockstep barrier stopped early")
            start = clock()
            values[node] = node.target(*args, **kwargs)
            ns = clock() - start
            if profiled(node):
                name = charged.get(node.name, node.name)
                times[name] = times.get(name, 0) + ns
            for done in freed_after.get(node, ()):
                del values[done]
    return times
