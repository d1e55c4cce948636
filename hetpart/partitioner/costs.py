"""The cost model: every formula of what a stage costs, written once.

Stage time (compute plus the boundaries on both sides), boundary bytes, the
link between two slots and its transfer time, stage memory (weights, training
state, the activation stash), and the device-sequence state the DPs and the
bounds walk (which devices are interchangeable, whether two consecutive stages
share a machine). `evaluate.py`, `dp.py`, `ideals.py`, `bounds.py` and the
CP-SAT model keep their own encodings (numpy tables, bit matrices, linear
constraints) but take every coefficient from here, and
`tests/partitioner/test_costs.py` checks each engine's stage times against
`evaluate` on random problems. See NOTE [stage time].
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from hetpart.partitioner.problem import MEM_BYTES, MEM_BYTES_OF, OUT_BYTES, OUT_TENSORS, TIME_NS, Link, Problem, Slot
from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES, stage_stash

# NOTE [stage time]
# A plan is a chain of stages 0..S-1, stage k on slot `slot_of_stage[k]` (today one device, see
# NOTE [slots] in problem.py). A stage's time (`stage_time_ns`) is its compute time
# (`stage_compute_ns`: the sum of its nodes' times on its slot's device type) plus the transfer
# time of the boundaries on BOTH of its sides (boundary k-1|k and boundary k|k+1): transfers are
# not overlapped with compute, and a boundary occupies both stages it joins.
# A value produced by node u in stage s and last consumed in stage t > s is sent from stage to
# stage: it crosses every boundary s|s+1, ..., t-1|t and pays its `out_bytes` on each (it passes
# through the stages in between; `boundary_bytes`).
# A boundary costs `transfer_ns(link, bytes, tensors)` over the link between its two slots
# (`link_between`: the machine's intra-node link when both are on one machine, else the
# network): one latency per tensor crossing it plus bytes / bandwidth, and nothing at all when
# no byte crosses. Per tensor, because the runtime sends each boundary value as a message of its
# own (the stage's outputs, NOTE [pass-through of skip values] in codegen/split.py; pipelining
# posts an isend/irecv per tensor, and gloo's receiver pays a posting call per message): a
# node's output is OUT_TENSORS tensors (a multi-output op's parts, NOTE [what the partitioner
# sees]; default 1), and a boundary's count, like its bytes, is the sum over the values crossing
# it (`boundary_bytes(..., weight=OUT_TENSORS)`, `node_out_tensors`). `hetpart profile-link`
# fits the latency per message, i.e. per tensor. An engine that cannot know a boundary's count
# (the search-free bounds) uses the fewest any boundary can have: a minimum cut of tensors, at
# least 1 where bytes cross (bounds.py).
# A stage's memory is the `mem_bytes` of its nodes plus every weight its nodes read, each
# weight counted once per stage (a weight read in two stages is held by both); in training,
# see NOTE [training memory].

# NOTE [training memory]
# In inference a stage holds its weights and the activations of one
# microbatch. In training (`Problem.training`) it also holds, per weight, its
# gradient and the optimizer's state (`Training.state_bytes`: Adam in fp32 is
# 4 + 8 bytes per 4-byte parameter), and the activations of every microbatch
# it has run forward but not yet backward -- the stash:
#   GPipe: all M microbatches run forward before the first backward, so M;
#   1F1B: stage k of S runs S-1-k warm-up forwards, then one forward before
#     each backward, so it keeps min(S-k, M) (stage 0 keeps the most);
#   interleaved 1F1B and zero bubble (S = v*D stages, `Training.virtual_stages` = v): the most
#     forwards of stage k not yet backward (zero bubble: not yet weight-gradient) along its
#     rank's order, `simulate.stage_stash` (NOTE [virtual-stage schedules]); at most M.
# The stash depends on S, the number of stages used: CP-SAT enforces it under
# a literal per possible S (cpsat.py), the DP and the bounds use the largest
# (`max_stage_memory_bytes`) or the least (`least_stash`) as their relaxation needs.
# `stage_memory_bytes` is the one formula; evaluate, the verifier and the
# CP-SAT constraint all call it.

# NOTE [memory per slot type]
# A problem may hold memory that depends on the slot's type: a node's MEM_BYTES_OF[type] and a
# weight's `Problem.held_bytes_of[type][w]` replace its MEM_BYTES and `held_weight_bytes` on slots of
# that type (a plan mixing tensor-parallel degrees, NOTE [tensor-parallel degree choice]: a TP-t rank
# holds 1/t of what the sharding splits). `node_mem_bytes` and `held_weight_bytes` with a
# `slot_type` are the one place they are read; without one (or on a type with no entry) they give the
# type-free values, which lowering sets to the least over the slot types, so every bound that counts
# memory type-free (bounds.py, lp_bounds.py, constraints.py, infeasible.py) relaxes it and stays valid.
# Every engine a plan can come from takes the slot's own: evaluate (the plan's reported memory and the
# verifier), the DP over an order (one memory table per type, `has_typed_memory`) and the CP-SAT model
# (a memory constraint per type); the DP over ideals does not, and solve.py skips it on such problems.


# --- Time.

def stage_time_ns(compute_ns: Any, comm_in_ns: Any, comm_out_ns: Any) -> Any:
    """A stage's time: its compute plus the boundaries on both of its sides (NOTE [stage time]).

    Ints, numpy arrays (the DPs' tables) or CP-SAT expressions alike.

        >>> stage_time_ns(50, 0, 10_005)
        10055
    """
    return compute_ns + comm_in_ns + comm_out_ns


def segment_time_table_ns(compute_prefix_ns: tuple[np.ndarray, np.ndarray], comm_in_ns: np.ndarray,
                          comm_out_ns: np.ndarray) -> np.ndarray:
    """`stage_time_ns` of every segment [i, j) of an order at once, for the DPs: [a, b] is the time
    of the stage from start a to end b, given the compute prefix sums at the starts and at the ends
    (`compute_prefix_ns` = (prefix at starts, prefix at ends)) and the boundary times into each
    start and out of each end. Summed per axis first: one matrix, not three.

        >>> segment_time_table_ns((np.array([0, 5]), np.array([9])), np.array([1, 2]), np.array([3]))
        array([[13],
               [ 9]])
    """
    at_starts, at_ends = compute_prefix_ns
    return (comm_in_ns - at_starts)[:, None] + (at_ends + comm_out_ns)[None, :]


# NOTE [backward split]: zero-bubble schedules run a stage's backward as two actions, the input
# gradient (sent to the previous stage at once) and the weight gradient (deferred into the
# bubbles). For a matmul y = x W each is one matmul of the forward's size, so the split is half
# and half; ops without weights (norms, activations) have only an input gradient, so the input
# half is a lower estimate where they dominate. `backward_split_ns` is the one rule the simulator,
# the report and the benchmark use.
def backward_split_ns(backward_ns: int) -> tuple[int, int]:
    """(input gradient, weight gradient) of a stage whose full backward takes `backward_ns` (NOTE [backward split]).

        >>> backward_split_ns(7)
        (4, 3)
    """
    weight = backward_ns // 2
    return backward_ns - weight, weight


def node_time_ns(problem: Problem, v: str, device_type: str) -> int:
    """Node `v`'s compute time on a slot of `device_type`."""
    return problem.graph.nodes[v][TIME_NS][device_type]


def stage_compute_ns(problem: Problem, nodes: Iterable[str], device_type: str) -> int:
    """A stage's compute: the sum of its nodes' times on its slot's device type (NOTE [stage time])."""
    return sum(node_time_ns(problem, v, device_type) for v in nodes)


def slot_compute_ns(problem: Problem, nodes: Iterable[str], slot: Slot) -> int:
    """A stage's compute on `slot` (NOTE [slots]): for a "device" slot, its nodes' times on the type."""
    if slot.kind != "device":
        raise NotImplementedError(f"slot kind {slot.kind!r} has no compute formula yet (NOTE [slots])")
    return stage_compute_ns(problem, nodes, slot.type)


def slot_capacity_bytes(problem: Problem, slot: Slot) -> int:
    """The memory a stage on `slot` may use: its (one) device's capacity (NOTE [slots])."""
    return min(problem.device(d).capacity_bytes for d in slot.devices)


def node_times_ns(problem: Problem, order: Sequence[str], device_type: str) -> np.ndarray:
    """`node_time_ns` of each node of `order`, as a vector: the engines' tables are sums of it."""
    return np.array([node_time_ns(problem, v, device_type) for v in order], dtype=np.int64)


def transfer_ns(link: Link, nbytes: Any, tensors: Any = 1) -> Any:
    """Time to move `nbytes` in `tensors` messages over `link`: a latency per message plus bytes /
    bandwidth rounded up, and nothing when nothing moves (NOTE [stage time]). `nbytes` and `tensors`
    may be ints or numpy vectors.

        >>> transfer_ns(Link(bandwidth_bytes_per_us=100, latency_ns=5), 1000), transfer_ns(Link(100, 5), 0)
        (10005, 0)
        >>> transfer_ns(Link(100, 5), 1000, 4)
        10020
    """
    bw = link.bandwidth_bytes_per_us
    if isinstance(nbytes, np.ndarray) or isinstance(tensors, np.ndarray):
        nbytes = np.asarray(nbytes, dtype=np.int64)
        return np.where(nbytes > 0, link.latency_ns * np.asarray(tensors, dtype=np.int64)
                        + (nbytes * 1000 + bw - 1) // bw, 0).astype(np.int64)
    if nbytes <= 0:
        return 0
    return link.latency_ns * tensors + -(-nbytes * 1000 // bw)


def allreduce_ns(link: Link, nbytes: int, ranks: int, buckets: int = 1) -> int:
    """A ring all-reduce of `nbytes` among `ranks` over `link` (NOTE [gradient sync] in pipelines.py):
    each rank sends and receives 2(r-1)/r of the bytes, in 2(r-1) steps that each pay the latency,
    once per bucket; one rank, or nothing to move, costs nothing.

        >>> allreduce_ns(Link(bandwidth_bytes_per_us=1000, latency_ns=10), 4000, 4)  # 6000 bytes, 6 steps
        6060
        >>> allreduce_ns(Link(1000, 10), 4000, 1), allreduce_ns(Link(1000, 10), 0, 4)
        (0, 0)
    """
    if ranks <= 1 or nbytes <= 0:
        return 0
    bw = link.bandwidth_bytes_per_us
    moved = -(-2 * (ranks - 1) * nbytes // ranks)
    return 2 * (ranks - 1) * link.latency_ns * max(1, buckets) + -(-moved * 1000 // bw)


def allgather_ns(link: Link, nbytes: int, ranks: int) -> int:
    """A ring all-gather of a tensor of `nbytes` (whole) among `ranks` over `link`: each rank sends and receives
    (r-1)/r of the bytes in r-1 steps that each pay the latency; one rank, or nothing, costs nothing.

        >>> allgather_ns(Link(bandwidth_bytes_per_us=1000, latency_ns=10), 4000, 4)  # 3000 bytes, 3 steps
        3030
    """
    if ranks <= 1 or nbytes <= 0:
        return 0
    moved = -(-(ranks - 1) * nbytes // ranks)
    return (ranks - 1) * link.latency_ns + -(-moved * 1000 // link.bandwidth_bytes_per_us)


def machine_link(problem: Problem, machine_a: str, machine_b: str) -> Link:
    """The link between a slot on `machine_a` and one on `machine_b`: the machine's intra-node
    link when they are the same machine, else the network."""
    return problem.intra_node_links[machine_a] if machine_a == machine_b else problem.network


def link_between(problem: Problem, a: str, b: str) -> Link:
    """The link of a boundary between the slots named `a` and `b` (NOTE [stage time], NOTE [slots])."""
    return machine_link(problem, problem.slot(a).node, problem.slot(b).node)


def links(problem: Problem) -> list[Link]:
    """Every link a boundary may take: the network, then each machine's intra-node link."""
    return [problem.network, *problem.intra_node_links.values()]


# --- Bytes and tensors over boundaries.

def node_out_tensors(problem: Problem, v: str) -> int:
    """The tensors node `v`'s output sends on each boundary it crosses: its OUT_TENSORS (default 1),
    none when it has no bytes (NOTE [stage time])."""
    a = problem.graph.nodes[v]
    return a.get(OUT_TENSORS, 1) if a.get(OUT_BYTES, 0) > 0 else 0


def node_sends(problem: Problem, weight: str = OUT_BYTES) -> dict[str, int]:
    """What each node's output puts on a boundary it crosses: its bytes (OUT_BYTES) or its tensors (OUT_TENSORS)."""
    g = problem.graph
    if weight == OUT_BYTES:
        return {v: g.nodes[v].get(OUT_BYTES, 0) for v in g.nodes}
    if weight == OUT_TENSORS:
        return {v: node_out_tensors(problem, v) for v in g.nodes}
    raise ValueError(f"weight must be {OUT_BYTES!r} or {OUT_TENSORS!r}, got {weight!r}")


def boundary_bytes(problem: Problem, stage_of: Mapping[str, int], num_stages: int,
                   weight: str = OUT_BYTES) -> list[int]:
    """Bytes (`weight=OUT_TENSORS`: tensors) crossing each boundary k (between stage k and k+1), k = 0..num_stages-2.

    See NOTE [stage time]: node u's output crosses boundary k when
    stage(u) <= k < max(stage of u's successors).
    """
    g = problem.graph
    sent = node_sends(problem, weight)
    crossing = [0] * max(0, num_stages - 1)
    for u in g.nodes:
        amount = sent[u]
        succs = list(g.successors(u))
        if amount <= 0 or not succs:
            continue
        for k in range(stage_of[u], max(stage_of[v] for v in succs)):
            crossing[k] += amount
    return crossing


def order_cut_bytes(problem: Problem, order: list[str], weight: str = OUT_BYTES) -> np.ndarray:
    """`boundary_bytes` (of `weight`) of every cut j of a topological order (between positions j-1 and j), j = 0..n.

    A node's output crosses every cut between it and its last reader (NOTE [stage time]).
    """
    g = problem.graph
    sent = node_sends(problem, weight)
    pos = {v: i for i, v in enumerate(order)}
    diff = np.zeros(len(order) + 2, dtype=np.int64)
    for u in order:
        amount = sent[u]
        last = max((pos[v] for v in g.successors(u)), default=-1)
        if amount > 0 and last > pos[u]:
            diff[pos[u] + 1] += amount
            diff[last + 1] -= amount
    return np.cumsum(diff)[: len(order) + 1]


def downset_cut_bytes(problem: Problem, order: list[str], member: np.ndarray, weight: str = OUT_BYTES) -> np.ndarray:
    """`boundary_bytes` (of `weight`) after each set of nodes (a row of `member`, bool over `order`,
    closed under predecessors): the outputs of the set's nodes read outside it (NOTE [stage time])."""
    g = problem.graph
    sent = node_sends(problem, weight)
    index = {v: i for i, v in enumerate(order)}
    cut = np.zeros(len(member), dtype=np.int64)
    for u in order:
        amount = sent[u]
        succ = [index[v] for v in g.successors(u)]
        if amount > 0 and succ:
            cut += amount * (member[:, index[u]] & ~member[:, succ].all(axis=1))
    return cut


# --- Memory.

def stash_microbatches(problem: Problem, stage: int, num_stages: int) -> int:
    """Microbatches of activations stage `stage` of `num_stages` holds at its peak (NOTE [training memory]).

        >>> from hetpart.partitioner.problem import Training
        >>> p = Problem(graph=None, weights={}, devices=[], intra_node_links={}, network=None,
        ...             training=Training("1f1b", microbatches=8))
        >>> [stash_microbatches(p, k, 4) for k in range(4)]
        [4, 3, 2, 1]
    """
    t = problem.training
    if t is None:
        return 1
    if t.schedule == "gpipe":
        return t.microbatches
    if t.schedule in VIRTUAL_SCHEDULES:
        if num_stages % t.virtual_stages:  # not a virtual-stage plan's stage count: the most any stage holds
            return t.microbatches
        return max(1, stage_stash(t.schedule, num_stages // t.virtual_stages, t.virtual_stages,
                                  t.microbatches)[stage])
    return max(1, min(num_stages - stage, t.microbatches))


def least_stash(problem: Problem) -> int:
    """The fewest microbatches of activations any stage of any plan holds (NOTE [training memory]).

    Inference and 1F1B (its last stage): 1; GPipe: M. Memory bounds must use this, not the largest.
    """
    t = problem.training
    return t.microbatches if t is not None and t.schedule == "gpipe" else 1


def training_state_bytes(param_bytes: int, params: int, optimizer_bytes_per_param: int) -> int:
    """A trainable weight's gradient (its own size) and optimizer state, in bytes (`Training.state_bytes`)."""
    return param_bytes + params * optimizer_bytes_per_param


def held_weight_bytes(problem: Problem, weight: str, slot_type: str | None = None) -> int:
    """Bytes a stage holding `weight` needs for it: the weight, plus gradient and optimizer state in training;
    on a slot of `slot_type`, that type's where it has its own (NOTE [memory per slot type])."""
    typed = problem.held_bytes_of.get(slot_type) if problem.held_bytes_of and slot_type is not None else None
    if typed is not None and weight in typed:
        return typed[weight]
    extra = problem.training.state_bytes.get(weight, 0) if problem.training is not None else 0
    return problem.weights[weight] + extra


def has_typed_memory(problem: Problem) -> bool:
    """Whether some slot type has memory of its own (NOTE [memory per slot type])."""
    return bool(problem.held_bytes_of) or any(MEM_BYTES_OF in a for _, a in problem.graph.nodes(data=True))


def node_mem_bytes(problem: Problem, v: str, slot_type: str | None = None) -> int:
    """Node `v`'s `mem_bytes` (one microbatch), on a slot of `slot_type` (NOTE [memory per slot type])."""
    a = problem.graph.nodes[v]
    typed = a.get(MEM_BYTES_OF)
    if typed and slot_type in typed:
        return typed[slot_type]
    return a.get(MEM_BYTES, 0)


def stage_memory_bytes(problem: Problem, activation_bytes: Any, held: Mapping[str, Any], stage: int,
                       num_stages: int, slot_type: str | None = None) -> Any:
    """Memory of stage `stage` of `num_stages` (NOTE [training memory]).

    `activation_bytes` is the sum of the stage's nodes' `mem_bytes` for one microbatch;
    `held` maps each weight to 1 when the stage holds it (0 or absent otherwise).
    Both may be CP-SAT linear expressions: the result is then one too.

        >>> from hetpart.partitioner.problem import Training
        >>> p = Problem(graph=None, weights={"w": 100}, devices=[], intra_node_links={}, network=None)
        >>> stage_memory_bytes(p, 10, {"w": 1}, 0, 2)
        110
        >>> p.training = Training("gpipe", microbatches=4, state_bytes={"w": 300})
        >>> stage_memory_bytes(p, 10, {"w": 1}, 0, 2)
        440
    """
    weights = sum(held_weight_bytes(problem, w, slot_type) * on for w, on in sorted(held.items()))
    return stash_microbatches(problem, stage, num_stages) * activation_bytes + weights


def tp_shard_bytes(nbytes: int, degree: int) -> int:
    """Bytes of one rank's part of a tensor split in `degree` (NOTE [tensor-parallel costs] in passes/tp_lower.py):
    a weight, its training state or an activation; rounded up.

        >>> tp_shard_bytes(1000, 3)
        334
    """
    return -(-nbytes // max(1, degree))


def stage_activation_bytes(problem: Problem, nodes: Iterable[str], slot_type: str | None = None) -> int:
    """The `mem_bytes` of a stage's nodes for one microbatch (the `activation_bytes` of `stage_memory_bytes`)."""
    return sum(node_mem_bytes(problem, v, slot_type) for v in nodes)


def max_stage_memory_bytes(problem: Problem, slot_type: str | None = None) -> tuple[int, dict[str, int]]:
    """(activation multiplier, bytes per held weight) that bound every stage's memory from above.

    For solvers that do not know a stage's index and the plan's stage count when
    they check memory (the DP): `mult * mem_bytes + sum(bytes[w])` is at least
    `stage_memory_bytes` of any stage in any plan.
    """
    t = problem.training
    mult = 1 if t is None else t.microbatches if t.schedule in ("gpipe", *VIRTUAL_SCHEDULES) else min(
        t.microbatches, problem.max_stages or len(problem.devices))
    return max(1, mult), {w: held_weight_bytes(problem, w, slot_type) for w in problem.weights}


# --- The device-sequence state of the DPs and the sequence bound.

@dataclass(frozen=True)
class DeviceClass:
    """Slots a DP treats as one: a stage on any of them costs the same (NOTE [device sequences])."""

    devices: tuple[str, ...]  # slot names in `Problem.slots` order: a plan uses a class's slots in this order
    type: str
    machine: str  # "" when the class spans machines (then every boundary is costed at the slowest link)
    capacity_bytes: int  # the smallest of its slots'


# NOTE [device sequences]
# The DP over an order (dp.py), the DP over ideals (ideals.py) and the sequence bound (bounds.py)
# choose a sequence of slots (NOTE [slots]; today devices), one per stage, and need not know which
# slot of a class of interchangeable ones a stage runs on: only how many of each class are used (`counts`), the class
# of the current stage (`cur`) and the link into it (`same`: -1 none, the first stage; 0 the
# network; 1 its machine's intra-node link). That state, `SequenceState`, and its moves are here;
# the link of a move is `same_machine`, and the time over it `link_kind_ns`. Classes are grouped
# by `device_classes(problem, key)`: "exact" (type, machine, capacity: `Problem.device_classes`),
# coarser keys for DPs that must shrink their state space (a class across machines has machine "",
# and its boundaries are costed at the slowest link, a valid over-estimate).
# (A slot's kind and device count belong in the exact key once slots of other kinds exist.)
CLASS_KEYS = {
    "exact": lambda s, cap: (s.type, s.node, cap),
    "type_machine": lambda s, cap: (s.type, s.node),
    "type_capacity": lambda s, cap: (s.type, cap),
    "type": lambda s, cap: (s.type,),
}


def device_classes(problem: Problem, key: str = "exact") -> list[DeviceClass]:
    """The slots grouped by `CLASS_KEYS[key]`, classes and members in `Problem.slots` order."""
    groups: dict[tuple, list[tuple[Slot, int]]] = {}
    for s in problem.slots:
        cap = slot_capacity_bytes(problem, s)
        groups.setdefault(CLASS_KEYS[key](s, cap), []).append((s, cap))
    out = []
    for members in groups.values():
        machines = {s.node for s, _ in members}
        out.append(DeviceClass(devices=tuple(s.name for s, _ in members), type=members[0][0].type,
                               machine=members[0][0].node if len(machines) == 1 else "",
                               capacity_bytes=min(cap for _, cap in members)))
    return out


class SequenceState(NamedTuple):
    """NOTE [device sequences]: devices used per class, the link into the current stage, its class.

    A tuple (hashed and ordered as one, fast in the DPs' dicts), read by field name.
    """

    counts: tuple[int, ...]
    same: int  # -1: no stage before; 0: the network; 1: the current class's machine's link
    cur: int


def first_states(classes: Sequence[DeviceClass]) -> list[SequenceState]:
    """The first stage on each class."""
    return [SequenceState(tuple(int(i == c) for i in range(len(classes))), -1, c) for c in range(len(classes))]


def same_machine(classes: Sequence[DeviceClass], c1: int, c2: int) -> int:
    """1 when a boundary between stages on classes c1 and c2 runs over one machine's link, else 0."""
    return int(classes[c1].machine != "" and classes[c1].machine == classes[c2].machine)


def next_state(classes: Sequence[DeviceClass], state: SequenceState, nxt: int) -> SequenceState | None:
    """The state after one more stage on class `nxt`; None when the class has no device left."""
    if state.counts[nxt] >= len(classes[nxt].devices):
        return None
    counts = state.counts[:nxt] + (state.counts[nxt] + 1,) + state.counts[nxt + 1:]
    return SequenceState(counts, same_machine(classes, state.cur, nxt), nxt)


def sequence_devices(classes: Sequence[DeviceClass], class_of_stage: Iterable[int]) -> list[str]:
    """The devices of a sequence of classes: each class's devices in list order."""
    used = [0] * len(classes)
    out = []
    for c in class_of_stage:
        out.append(classes[c].devices[used[c]])
        used[c] += 1
    return out


def link_kind_ns(problem: Problem, cls: DeviceClass, same: int, nbytes: np.ndarray,
                 tensors: np.ndarray | int = 1) -> np.ndarray:
    """Times of boundaries carrying `nbytes` in `tensors` next to a stage on `cls` over link kind `same`
    (NOTE [device sequences]): none (-1) costs nothing; 1 is cls's machine's link; 0 the network,
    or, for a class across machines, the slowest link of all."""
    if same < 0:
        return np.zeros(len(nbytes), dtype=np.int64)
    if cls.machine == "":
        return np.max([transfer_ns(link, nbytes, tensors) for link in links(problem)], axis=0)
    if same:  # (a machine with one device has no link of its own, and never kind 1 in a plan)
        return transfer_ns(problem.intra_node_links.get(cls.machine, problem.network), nbytes, tensors)
    return transfer_ns(problem.network, nbytes, tensors)
