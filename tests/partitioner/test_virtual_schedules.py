"""Virtual-stage schedules and plans (issue 23), torch-free parts: the per-rank orders against torch's own
`pipeline_order`, the simulator's invariants, the stash rule, and the virtual plan's bound against brute force."""

import itertools
import random

import pytest

from hetpart.errors import HetpartError
from hetpart.partitioner.costs import backward_split_ns, stash_microbatches
from hetpart.partitioner.evaluate import bottleneck_ns, evaluate
from hetpart.partitioner.problem import PIN, PIN_FIRST, PIN_LAST, Device, Link, Training
from hetpart.partitioner.simulate import rank_orders, simulate, simulate_ranks, stage_stash
from hetpart.partitioner.verify import verify_plan
from hetpart.partitioner.virtual import check_virtual_options, plan_virtual, virtual_lower_bound_ns
from tests.partitioner.partition_cases import chain, make_problem

CASES = [(d, v, m) for d in range(1, 5) for v in range(1, 4) for m in range(1, 9) if m % max(1, m // d) == 0]


def _torch_orders(schedule: str, ranks: int, local: int, m: int) -> list[list[str]]:
    """torch's `pipeline_order` of the schedule class (computed as its __init__ does), idle slots dropped."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = {"interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
           "interleaved-zb": schedules.ScheduleInterleavedZeroBubble}[schedule]
    obj = cls.__new__(cls)  # __init__ needs live stages and a process group; the order needs only these
    obj.pp_group_size, obj.n_local_stages, obj._n_microbatches = ranks, local, m
    obj.number_of_rounds = max(1, m // ranks)
    obj.microbatches_per_round = m // obj.number_of_rounds
    obj.pipeline_order = {r: obj._calculate_single_rank_operations(r) for r in range(ranks)}
    if schedule == "interleaved-zb":
        obj.pipeline_order = obj._add_bubbles_to_actions(local * ranks)
    return [[str(a) for a in obj.pipeline_order[r] if a is not None] for r in range(ranks)]


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "interleaved-zb"])
def test_rank_orders_are_torchs_pipeline_order(schedule):
    for d, v, m in CASES:
        mine = [[str(a) for a in order] for order in rank_orders(schedule, d, v, m)]
        assert mine == _torch_orders(schedule, d, v, m), (schedule, d, v, m)


def test_the_runtime_runs_the_schedules_the_simulator_plays():
    from hetpart.partitioner.simulate import VIRTUAL_SCHEDULES
    from hetpart.runtime.schedules import MULTI_STAGE, SCHEDULES

    assert MULTI_STAGE == VIRTUAL_SCHEDULES and set(MULTI_STAGE) <= set(SCHEDULES)


def test_rank_orders_refuse_what_torch_refuses():
    with pytest.raises(HetpartError, match="multiple of their rounds"):
        rank_orders("interleaved-1f1b", 4, 2, 9)  # torch: "must be a multiple of the number of rounds (2)"
    with pytest.raises(HetpartError, match="unknown schedule"):
        rank_orders("zbv", 2, 2, 4)


@pytest.mark.parametrize("schedule", ["interleaved-1f1b", "interleaved-zb"])
def test_simulated_ranks_respect_dependencies_and_never_overlap(schedule):
    rng = random.Random(1)
    for d, v, m in CASES[::3]:
        s = d * v
        fwd = [rng.randint(1, 30) for _ in range(s)]
        bwd = [rng.randint(1, 60) for _ in range(s)]
        xfer = [rng.randint(0, 9) for _ in range(s - 1)]
        split = [backward_split_ns(b) for b in bwd]
        t = simulate_ranks(fwd, xfer, m, schedule, d, [i for i, _ in split], [w for _, w in split])
        compute = [e for e in t.events if e.kind != "send"]
        assert len(compute) == s * m * (2 if schedule == "interleaved-1f1b" else 3)
        for r in range(d):  # one thing at a time per rank (its sends and receives included)
            mine = sorted((e.start_ns, e.end_ns) for e in t.events if e.stage % d == r and e.kind != "send")
            assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:])), (schedule, d, v, m, r)
        end = {(e.stage, e.kind, e.microbatch): e for e in compute}
        for e in compute:  # a forward after the previous stage's, a backward after the next stage's
            if e.kind == "fwd" and e.stage > 0:
                assert e.start_ns >= end[(e.stage - 1, "fwd", e.microbatch)].end_ns + (
                    xfer[e.stage - 1] if (e.stage - 1) % d != e.stage % d else 0)
            if e.kind in ("bwd", "bwd_input") and e.stage < s - 1:
                assert e.start_ns >= end[(e.stage + 1, e.kind, e.microbatch)].end_ns
            if e.kind == "bwd_weight":
                assert e.start_ns >= end[(e.stage, "bwd_input", e.microbatch)].end_ns
        busy = sum(fwd) + sum(bwd)
        assert t.step_ns >= m * busy / d  # no rank does more than all its work in less time


def test_zero_bubble_fills_the_bubble_and_interleaving_shortens_1f1b():
    """Equal stages, no transfers, 4 ranks, 8 microbatches: each schedule's step, independently known."""
    one = simulate([20] * 4, [0] * 3, 8, "1f1b", backward_ns=[40] * 4).step_ns  # (M + S - 1) (f + b)
    assert one == (8 + 3) * 60
    inter = simulate([10] * 8, [0] * 7, 8, "interleaved-1f1b", backward_ns=[20] * 8, ranks=4).step_ns
    zb = simulate([10] * 8, [0] * 7, 8, "interleaved-zb", backward_ns=[20] * 8, ranks=4).step_ns
    work = 8 * 60  # each rank's forwards and backwards of its two stages
    assert work < zb < inter < one


def test_stash_rule_counts_the_order_and_memory_uses_it():
    for d, v, m in CASES:
        for schedule in ("interleaved-1f1b", "interleaved-zb"):
            stash = stage_stash(schedule, d, v, m)
            assert all(1 <= k <= m for k in stash) and (stash[-1] == 1 or schedule == "interleaved-zb")
            held = {}  # replayed from the order of torch's kinds, counted apart from stage_stash
            for order in _torch_orders(schedule, d, v, m):
                live: dict[int, int] = {}
                for a in order:
                    stage, kind = int(a.rstrip("0123456789")[:-1]), a.rstrip("0123456789")[-1]
                    live[stage] = live.get(stage, 0) + {"F": 1, "B": -1, "W": -1}.get(kind, 0)
                    held[stage] = max(held.get(stage, 0), live[stage])
            assert [held[k] for k in range(d * v)] == stash
    p = make_problem(*chain(2, {"a": 1}), [Device("d0", "a", "m", 10)])
    p.training = Training("interleaved-1f1b", microbatches=4, virtual_stages=2)
    assert [stash_microbatches(p, k, 4) for k in range(4)] == stage_stash("interleaved-1f1b", 2, 2, 4)


def _brute_optimum(problem, devices, v):
    """The least stage bottleneck of every plan of v*D non-empty stages, stage k on devices[k mod D], each
    device's stages summing within its capacity: by enumeration, sharing nothing with the DP."""
    vp = plan_virtual(problem, v, devices).problem  # (only its devices: the names of the sequence)
    g, nodes, s = problem.graph, list(problem.graph.nodes), v * len(devices)
    seq = [f"{devices[k % len(devices)]}#{k // len(devices)}" for k in range(s)]
    best = None
    for assign in itertools.product(range(s), repeat=len(nodes)):
        stage_of = dict(zip(nodes, assign))
        if (set(assign) != set(range(s)) or any(stage_of[a] > stage_of[b] for a, b in g.edges)
                or any(g.nodes[x].get(PIN) == PIN_FIRST and stage_of[x] != 0 for x in nodes)
                or any(g.nodes[x].get(PIN) == PIN_LAST and stage_of[x] != s - 1 for x in nodes)):
            continue
        stages = evaluate(vp, stage_of, seq)
        mem = [sum(st.memory_bytes for st in stages if st.index % len(devices) == r) for r in range(len(devices))]
        if any(mem[r] > problem.device(d).capacity_bytes for r, d in enumerate(devices)):
            continue
        value = bottleneck_ns(stages)
        best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_virtual_plan_bound_holds_against_brute_force(seed):
    rng = random.Random(seed)
    n = rng.randint(4, 6)
    nodes, edges = chain(n, {"a": 1})
    for v in nodes.values():
        v.update(time={"a": rng.randint(1, 40), "b": rng.randint(1, 40)}, out=rng.choice([0, 100, 1000]),
                 mem=rng.randint(0, 5))
    edges += [(f"op{i}", f"op{j}") for i in range(n) for j in range(i + 2, n) if rng.random() < 0.3]
    nodes["op0"]["pin"] = PIN_FIRST
    devices = [Device("x/0", "a", "x", rng.choice([20, 1000])), Device("x/1", "b", "x", 1000)]
    p = make_problem(nodes, edges, devices, intra=Link(100, 5))
    optimum = _brute_optimum(p, ["x/0", "x/1"], 2)
    try:
        got = plan_virtual(p, 2, ["x/0", "x/1"])
    except HetpartError:
        return  # no plan within capacity // v per stage (a sufficient rule): nothing claimed
    verify_plan(got.problem, got.plan)
    assert optimum is not None and got.plan.lower_bound_ns <= optimum <= got.plan.bottleneck_ns
    assert got.plan.solver_status == "FEASIBLE"
    assert all(mem <= p.device(d).capacity_bytes for mem, d in zip(got.device_memory_bytes(), got.devices))
    assert got.device_of_stage == ["x/0", "x/1", "x/0", "x/1"]
    assert virtual_lower_bound_ns(got.problem, 4) == got.plan.lower_bound_ns


def test_a_chain_plan_is_the_brute_force_optimum_when_memory_is_roomy():
    nodes, edges = chain(6, {"a": 1})
    for i, v in enumerate(nodes.values()):
        v["time"] = {"a": [5, 30, 7, 12, 40, 3][i]}
    p = make_problem(nodes, edges, [Device("x/0", "a", "x", 10**9), Device("x/1", "a", "x", 10**9)])
    got = plan_virtual(p, 2)
    assert got.plan.bottleneck_ns == _brute_optimum(p, ["x/0", "x/1"], 2)


@pytest.mark.parametrize("schedule, v, several, strategy, message", [
    ("gpipe", 2, False, "optimal", "pass --schedule interleaved-1f1b or interleaved-zb with it"),
    ("interleaved-1f1b", 1, False, "optimal", "runs 2 or more stages per device"),
    ("interleaved-zb", None, True, "optimal", "leave out --pipelines and --parallel data"),
    ("interleaved-zb", 2, False, "equal-layers", "--strategy equal-layers writes a baseline's plan"),
    ("zbv", None, False, "optimal", "expected one of gpipe, 1f1b, interleaved-1f1b, interleaved-zb"),
])
def test_partition_options_refused_before_tracing(schedule, v, several, strategy, message):
    with pytest.raises(HetpartError, match=message.replace("-", "\\-")):
        check_virtual_options(schedule, v, 4, several, strategy)
    check_virtual_options("interleaved-1f1b", None, 4, False, "optimal")  # the default V = 2
