"""Small hand-made and random partitioning problems, and a brute-force optimum."""

from __future__ import annotations

import dataclasses
import random

import networkx as nx

from hetpart.partitioner import (
    COLOCATE,
    FORBIDDEN_TYPES,
    MEM_BYTES,
    OUT_BYTES,
    OUT_TENSORS,
    PIN,
    PIN_FIRST,
    PIN_LAST,
    TIME_NS,
    WEIGHTS,
    Device,
    Link,
    Problem,
    verify_plan,
)
from hetpart.partitioner.certificate import brute_force, valid_plans  # noqa: F401 (the tests' brute force)
from hetpart.partitioner.ideals import IdealResult, ideal_dp
from hetpart.partitioner.problem import Training

FAST_LINK = Link(bandwidth_bytes_per_us=1_000, latency_ns=0)  # 1 byte per ns


def roomy(p: Problem) -> Problem:
    """`p` with memory that never binds: the ideal DP is then exact, not just a bound."""
    return dataclasses.replace(p, devices=[dataclasses.replace(d, capacity_bytes=10**12) for d in p.devices])


def ideal_dp_holds(p: Problem, optimum: int) -> IdealResult:
    """The ideal DP told to beat optimum + 1: a bound no higher than the optimum, and a plan (when
    it returns one) that is valid; it is optimal when it meets the bound."""
    got = ideal_dp(p, optimum + 1)
    assert got is not None and got.bound_ns <= optimum
    if got.plan is not None:
        verify_plan(p, got.plan)
        assert got.plan.bottleneck_ns >= optimum
    return got


def make_problem(
    nodes: dict[str, dict],
    edges: list[tuple[str, str]],
    devices: list[Device],
    *,
    weights: dict[str, int] | None = None,
    intra: Link = FAST_LINK,
    network: Link = FAST_LINK,
    max_stages: int | None = None,
) -> Problem:
    """`nodes` maps a name to {"time": {type: ns}, "mem": b, "out": b, "weights": (...), "pin": ...,
    "colocate": group name, "forbidden": (device types,), "tensors": OUT_TENSORS}."""
    g = nx.DiGraph()
    for name, spec in nodes.items():
        g.add_node(
            name,
            **{
                TIME_NS: spec["time"],
                MEM_BYTES: spec.get("mem", 0),
                OUT_BYTES: spec.get("out", 0),
                WEIGHTS: tuple(spec.get("weights", ())),
                PIN: spec.get("pin"),
                **({COLOCATE: spec["colocate"]} if spec.get("colocate") else {}),
                **({FORBIDDEN_TYPES: tuple(spec["forbidden"])} if spec.get("forbidden") else {}),
                **({OUT_TENSORS: spec["tensors"]} if spec.get("tensors") else {}),
            },
        )
    g.add_edges_from(edges)
    machines = sorted({d.node for d in devices})
    return Problem(
        graph=g,
        weights=dict(weights or {}),
        devices=devices,
        intra_node_links={m: intra for m in machines},
        network=network,
        max_stages=max_stages,
    )


def chain(n: int, time: dict[str, int], out: int = 0, mem: int = 0) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    names = [f"op{i}" for i in range(n)]
    return {v: {"time": dict(time), "out": out, "mem": mem} for v in names}, list(zip(names, names[1:]))


def random_problem(seed: int) -> Problem:
    """A DAG of 2..6 nodes on 3 devices: 2 types, 2 machines, sometimes a pin or tight memory."""
    rng = random.Random(seed)
    n = rng.randint(2, 6)
    names = [f"n{i}" for i in range(n)]
    weights = {"w0": rng.randint(1, 8), "w1": rng.randint(1, 8)}
    nodes = {}
    for i, v in enumerate(names):
        nodes[v] = {
            "time": {"a": rng.randint(1, 40), "b": rng.randint(1, 40)},
            "mem": rng.randint(0, 6),
            "out": rng.choice([0, 10, 100, 1000, 5000]),
            "weights": [w for w in sorted(weights) if rng.random() < 0.3],
        }
    if rng.random() < 0.4:
        nodes[names[0]]["pin"] = PIN_FIRST
    if rng.random() < 0.4:
        nodes[names[-1]]["pin"] = PIN_LAST
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1 :] if rng.random() < 0.4]
    cap = lambda: rng.choice([12, 20, 40, 1000])  # noqa: E731
    c0 = cap()
    devices = [
        Device("d0", "a", "m0", c0),
        Device("d1", "a", "m0", c0 if rng.random() < 0.5 else cap()),
        Device("d2", "b", "m1", cap()),
    ]
    intra = Link(rng.choice([100, 1000, 10_000]), rng.choice([0, 5, 50]))
    network = Link(rng.choice([10, 100, 1000]), rng.choice([0, 20, 200]))
    return make_problem(
        nodes, edges, devices, weights=weights, intra=intra, network=network,
        max_stages=rng.choice([None, None, 2]),
    )


def random_large(seed: int, n: int, num_devices: int = 4) -> Problem:
    """A layered random DAG of n nodes (skip edges) on a few devices, for speed and determinism."""
    rng = random.Random(seed)
    names = [f"v{i:04d}" for i in range(n)]
    nodes = {
        v: {
            "time": {"a": rng.randint(10, 100), "b": rng.randint(20, 300)},
            "mem": rng.randint(1, 100),
            "out": rng.choice([0, 1_000, 10_000]),
            "weights": [f"w{i // 5}"] if rng.random() < 0.5 else [],
        }
        for i, v in enumerate(names)
    }
    nodes[names[0]]["pin"] = PIN_FIRST
    nodes[names[-1]]["pin"] = PIN_LAST
    edges = [(names[i], names[i + 1]) for i in range(n - 1)]
    edges += [(names[i], names[min(n - 1, i + rng.randint(2, 20))]) for i in range(0, n - 2, 3)]
    weights = {f"w{i}": rng.randint(100, 1_000) for i in range(n // 5 + 1)}
    devices = [Device(f"d{i}", "a" if i % 2 == 0 else "b", f"m{i // 2}", 10**9) for i in range(num_devices)]
    return make_problem(nodes, edges, devices, weights=weights, intra=Link(10_000, 10), network=Link(1_000, 100))


# Device types of `transformer_problem`: peak FLOP/s, memory bandwidth (bytes/s), per-op overhead (ns).
_XF_TYPES = {"a100": (312e12 * 0.6, 2.0e12 * 0.8, 5_000), "v100": (125e12 * 0.6, 0.9e12 * 0.8, 8_000),
             "t4": (65e12 * 0.5, 0.32e12 * 0.8, 10_000)}


def transformer_problem(num_nodes: int, seed: int = 0) -> Problem:
    """A decoder-only transformer of about `num_nodes` FX-level ops on 8 devices of 3 types over 4 machines.

    Each block is 22 ops (layer norm, q/k/v projections in parallel, views, scores, mask,
    softmax, attention, output projection, residual add, MLP, residual add), with the two
    residual skips and an attention mask that every block reads (so it crosses every cut),
    token embedding and a tied LM head. Times are rooflines (FLOPs / peak, bytes / bandwidth,
    plus a per-op overhead, +-10% per op and type, views free); weights are fp16 and sized so
    the weights fill about 40% of the cluster's memory (activations: half an output each, at most
    half the hidden state). Every op has its block as LAYER.
    """
    rng = random.Random(seed)
    blocks = max(1, (num_nodes - 6) // 22)
    capacities = {"a100": 80 << 30, "v100": 32 << 30, "t4": 16 << 30}
    kinds = ["a100", "a100", "v100", "v100", "t4", "t4", "t4", "t4"]
    devices = [Device(f"{t}-{i}", t, f"m{i // 2}", capacities[t]) for i, t in enumerate(kinds)]
    d = int((sum(capacities[t] for t in kinds) * 0.4 / (blocks * 24)) ** 0.5) // 64 * 64
    seq, heads, vocab = 1024, max(1, d // 128), 32_000
    act = seq * d * 2
    g = nx.DiGraph()
    weights: dict[str, int] = {"wte": vocab * d * 2}

    def op(name: str, flops: float, nbytes: float, out: int, layer: str, w: tuple[str, ...] = (),
           free: bool = False, pin: str | None = None, preds: tuple[str, ...] = ()) -> str:
        times = {}
        for t, (peak, bw, overhead) in _XF_TYPES.items():
            base = 0.0 if free else max(flops / peak, nbytes / bw) * 1e9 + overhead
            times[t] = int(base * rng.uniform(0.9, 1.1))
        g.add_node(name, **{TIME_NS: times, MEM_BYTES: min(out, act) // 2, OUT_BYTES: out, WEIGHTS: w, PIN: pin,
                            "layer": layer})
        g.add_edges_from((p, name) for p in preds)
        return name

    def linear(name: str, x: str, d_in: int, d_out: int, layer: str) -> str:
        weights[f"{name}.w"] = d_in * d_out * 2
        return op(name, 2 * seq * d_in * d_out, (seq * (d_in + d_out) + d_in * d_out) * 2, seq * d_out * 2, layer,
                  (f"{name}.w",), preds=(x,))

    tokens = op("tokens", 0, 0, seq * 8, "", free=True, pin=PIN_FIRST)
    mask = op("mask", 0, 0, seq * seq, "", free=True, pin=PIN_FIRST)
    x = op("embed", 0, act, act, "wte", ("wte",), preds=(tokens,))
    for b in range(blocks):
        L, p = f"blocks.{b}", f"b{b}."
        ln1 = op(p + "ln1", 5 * seq * d, 2 * act, act, L, preds=(x,))
        q, k, v = (linear(p + n, ln1, d, d, L) for n in "qkv")
        qv, kv, vv = (op(p + n + "_view", 0, 0, act, L, free=True, preds=(s,)) for n, s in zip("qkv", (q, k, v)))
        kt = op(p + "k_t", 0, 0, act, L, free=True, preds=(kv,))
        score_bytes = heads * seq * seq * 2
        s = op(p + "scores", 2 * seq * seq * d, 2 * act + score_bytes, score_bytes, L, preds=(qv, kt))
        s = op(p + "scale", heads * seq * seq, 2 * score_bytes, score_bytes, L, preds=(s,))
        s = op(p + "mask_add", heads * seq * seq, 2 * score_bytes, score_bytes, L, preds=(s, mask))
        s = op(p + "softmax", 5 * heads * seq * seq, 2 * score_bytes, score_bytes, L, preds=(s,))
        a = op(p + "attn", 2 * seq * seq * d, score_bytes + 2 * act, act, L, preds=(s, vv))
        a = op(p + "attn_t", 0, 0, act, L, free=True, preds=(a,))
        a = op(p + "attn_view", 0, 0, act, L, free=True, preds=(a,))
        o = linear(p + "o", a, d, d, L)
        x1 = op(p + "add1", seq * d, 3 * act, act, L, preds=(x, o))
        ln2 = op(p + "ln2", 5 * seq * d, 2 * act, act, L, preds=(x1,))
        h = linear(p + "fc1", ln2, d, 4 * d, L)
        h = op(p + "gelu", 8 * seq * 4 * d, 8 * act, 4 * act, L, preds=(h,))
        f = linear(p + "fc2", h, 4 * d, d, L)
        x = op(p + "add2", seq * d, 3 * act, act, L, preds=(x1, f))
    x = op("ln_f", 5 * seq * d, 2 * act, act, "ln_f", preds=(x,))
    logits = op("lm_head", 2 * seq * d * vocab, (seq * (d + vocab) + d * vocab) * 2, seq * vocab * 2, "lm_head",
                ("wte",), preds=(x,))
    op("output", 0, 0, 0, "", free=True, pin=PIN_LAST, preds=(logits,))
    machines = sorted({dev.node for dev in devices})
    intra = {"m0": Link(300_000, 2_000), "m1": Link(150_000, 2_000), "m2": Link(16_000, 5_000),
             "m3": Link(16_000, 5_000)}
    return Problem(graph=g, weights=weights, devices=devices, intra_node_links={m: intra[m] for m in machines},
                   network=Link(12_500, 10_000))


def constrained_problem(seed: int) -> Problem:
    """`random_problem` with co-location groups and forbidden device types on some nodes."""
    rng = random.Random(1000 + seed)
    p = random_problem(seed)
    g = p.graph
    nodes = list(g.nodes)
    for v in nodes:
        r = rng.random()
        if r < 0.25:
            g.nodes[v][FORBIDDEN_TYPES] = (rng.choice(["a", "b"]),)
        elif r < 0.3:
            g.nodes[v][FORBIDDEN_TYPES] = ("a", "b")  # runs nowhere: solve must say which node
    if len(nodes) >= 2 and rng.random() < 0.7:
        for v in rng.sample(nodes, rng.randint(2, min(3, len(nodes)))):
            g.nodes[v][COLOCATE] = "tied"
    return p


def twin_problem(seed: int) -> Problem:
    """Copies of one small branch (equal costs, weights of equal sizes) reading the same inputs,
    their outputs summed in order, joined at once, or read each by its own consumer (chained or
    not), sometimes one copy's first node read again: NOTE [twin branches] may order some
    copies, none or all. 4..9 nodes on 3 devices."""
    rng = random.Random(2000 + seed)
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []
    weights: dict[str, int] = {}

    def node(name: str, **spec) -> str:
        nodes[name] = {"time": {"a": rng.randint(1, 40), "b": rng.randint(1, 40)}, "mem": rng.randint(0, 6),
                       "out": rng.choice([0, 10, 100, 1000, 5000]), **spec}
        return name

    inputs = [node("x", **({"pin": PIN_FIRST} if rng.random() < 0.4 else {}))]
    if rng.random() < 0.4:
        inputs.append(node("y"))
        edges.append(("x", "y"))
    size, copies = rng.choice([(1, 2), (1, 3), (2, 2)])
    shape = rng.choice(["chain", "parallel"])  # of a two-node branch
    template = [{"time": {"a": rng.randint(1, 40), "b": rng.randint(1, 40)}, "mem": rng.randint(0, 6),
                 "out": rng.choice([0, 10, 100, 1000, 5000]), "wsize": rng.choice([0, 0, 3, 7]),
                 "reads": [u for u in inputs if rng.random() < 0.7] or inputs[:1]} for _ in range(size)]
    ends = []
    for c in range(copies):
        names = []
        for k, t in enumerate(template):
            name = f"b{c}_{k}"
            w = (f"w{c}_{k}",) if t["wsize"] else ()
            if w:
                weights[w[0]] = t["wsize"]
            nodes[name] = {"time": dict(t["time"]), "mem": t["mem"], "out": t["out"], "weights": w}
            if k and shape == "chain":
                edges.append((names[-1], name))
            else:
                edges.extend((u, name) for u in t["reads"])
            names.append(name)
        ends.append(names if shape == "parallel" else names[-1:])
    consumers = rng.choice(["sum", "join", "chained", "apart"])
    if consumers == "sum":
        acc = node("s1")
        edges.extend((u, acc) for u in ends[0] + ends[1])
        for c in range(2, copies):
            nxt = node(f"s{c}")
            edges.extend([(acc, nxt)] + [(u, nxt) for u in ends[c]])
            acc = nxt
    elif consumers == "join":
        acc = node("j")
        edges.extend((u, acc) for e in ends for u in e)
    else:
        prev = None
        for c in range(copies):
            acc = node(f"r{c}")
            edges.extend((u, acc) for u in ends[c])
            if prev is not None and consumers == "chained":
                edges.append((prev, acc))
            prev = acc
    if rng.random() < 0.3:  # another reader of one copy's first node: its bytes may cross more boundaries
        edges.append((f"b{rng.randrange(copies)}_0", node("extra")))
        if rng.random() < 0.5:
            edges.append(("extra", acc))
    if rng.random() < 0.4:
        nodes[acc]["pin"] = PIN_LAST
    cap = lambda: rng.choice([15, 25, 40, 1000])  # noqa: E731
    devices = [Device("d0", "a", "m0", cap()), Device("d1", "a", "m0", cap()), Device("d2", "b", "m1", cap())]
    devices[1] = Device("d1", "a", "m0", devices[0].capacity_bytes)
    intra = Link(rng.choice([100, 1000, 10_000]), rng.choice([0, 5, 50]))
    network = Link(rng.choice([10, 100, 1000]), rng.choice([0, 20, 200]))
    return make_problem(nodes, edges, devices, weights=weights, intra=intra, network=network,
                        max_stages=rng.choice([None, None, 2]))


def pinned_problem(seed: int) -> Problem:
    """2..6 nodes (2..5 on 4 devices) on 2-4 devices of 1-2 types over 1-2 machines, always pinned: PIN_FIRST
    on a few nodes (not only sources: a pinned node takes its ancestors into stage 0), PIN_LAST on others
    (costly ones too, and ones with successors, NOTE [pins]); sometimes tight memory, max_stages, training,
    a co-location group or a forbidden type."""
    rng = random.Random(40_000 + seed)
    num_devices = rng.randint(2, 4)
    n = rng.randint(2, 6 if num_devices <= 3 else 5)
    names = [f"n{i}" for i in range(n)]
    weights = {"w0": rng.randint(1, 8), "w1": rng.randint(1, 8)}
    nodes = {v: {"time": {"a": rng.randint(0, 40) * 10, "b": rng.randint(0, 40) * 10}, "mem": rng.randint(0, 6),
                 "out": rng.choice([0, 10, 100, 1000, 5000]),
                 "weights": [w for w in sorted(weights) if rng.random() < 0.3]} for v in names}
    edges = [(u, v) for i, u in enumerate(names) for v in names[i + 1:]
             if rng.random() < 0.4 or (v == names[i + 1] and rng.random() < 0.6)]
    for v in [v for v in names if rng.random() < 0.3] or names[:1]:
        nodes[v]["pin"] = PIN_FIRST
    for v in names:
        if "pin" not in nodes[v] and rng.random() < 0.3:
            nodes[v]["pin"] = PIN_LAST
    if "pin" not in nodes[names[-1]] and rng.random() < 0.7:
        nodes[names[-1]]["pin"] = PIN_LAST
    if rng.random() < 0.25:
        for v in rng.sample(names, min(2, n)):
            nodes[v]["colocate"] = "tied"
    if rng.random() < 0.25:
        nodes[rng.choice(names)]["forbidden"] = (rng.choice("ab"),)
    cap = lambda: rng.choice([12, 20, 40, 1000])  # noqa: E731
    devices = [Device(f"d{i}", rng.choice("ab"), f"m{rng.randint(0, 1)}", cap()) for i in range(num_devices)]
    p = make_problem(nodes, edges, devices, weights=weights,
                     intra=Link(rng.choice([100, 1000, 10_000]), rng.choice([0, 5, 50])),
                     network=Link(rng.choice([10, 100, 1000]), rng.choice([0, 20, 200])),
                     max_stages=rng.choice([None, None, 2, 3]))
    if rng.random() < 0.3:
        p.training = Training(rng.choice(["gpipe", "1f1b"]), rng.randint(1, 4),
                              {w: rng.randint(0, 5) for w in weights})
    return p
