"""Rounding a plan to whole layers and planning with layer-aligned cuts (hetpart/export/layers.py)."""

from __future__ import annotations

import networkx as nx
import pytest

from hetpart.errors import HetpartError
from hetpart.export.layers import MODULE, LayerPlan, align_to_layers, layer_order, round_to_layers
from hetpart.partitioner import Device, Link, Problem, solve, verify_plan
from hetpart.partitioner.problem import MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS

LINK = Link(bandwidth_bytes_per_us=1_000_000, latency_ns=0)


def layered(layer_costs: list[list[int]], devices: int = 2, extra_weight: bool = False) -> Problem:
    """x -> layer 0's ops -> layer 1's ops -> ... -> out, on `devices` identical devices; layer i's
    ops cost layer_costs[i] ns each and read weight `blocks.i.w`."""
    g = nx.DiGraph()

    def add(name: str, cost: int, **attrs) -> None:
        g.add_node(name, **{TIME_NS: {"g": cost}, MEM_BYTES: 0, OUT_BYTES: 8, WEIGHTS: (), PIN: None} | attrs)

    add("x", 0, **{PIN: PIN_FIRST})
    prev = "x"
    weights = {}
    for i, costs in enumerate(layer_costs):
        for j, cost in enumerate(costs):
            name = f"l{i}_{j}"
            add(name, cost, **{MODULE: f"blocks.{i}", WEIGHTS: (f"blocks.{i}.w",)})
            g.add_edge(prev, name)
            prev = name
        weights[f"blocks.{i}.w"] = 4
    if extra_weight:  # a weight read at the top level, outside every layer (GPT's position embedding)
        add("pos", 1, **{WEIGHTS: ("wpe.weight",)})
        g.add_edge("x", "pos")
        g.add_edge("pos", "l0_0")
        weights["wpe.weight"] = 4
    add("out", 0, **{PIN: PIN_LAST})
    g.add_edge(prev, "out")
    return Problem(graph=g, weights=weights, devices=[Device(f"d{i}", "g", "m", 1 << 30) for i in range(devices)],
                   intra_node_links={"m": LINK}, network=LINK)


def test_op_level_plan_splits_a_layer_and_rounding_costs_it():
    # 3 layers of 3 ops of 10 ns on 2 devices: op by op 40 | 50, whole layers at best 30 | 60.
    p = layered([[10, 10, 10]] * 3)
    plan = solve(p, time_limit_s=5)
    lp = round_to_layers(p, plan)
    assert plan.bottleneck_ns < 60  # the op-level plan beats any layer-aligned one
    assert not lp.aligned and len(lp.split_by_plan) == 1
    assert lp.names == ["blocks.0", "blocks.1", "blocks.2"]
    assert lp.bottleneck_us == pytest.approx(plan.bottleneck_ns / 1000)
    assert lp.rounded_bottleneck_us * 1000 >= 60 and lp.rounded_bottleneck_us > lp.bottleneck_us
    assert sorted(set(lp.stage_of_layer)) == [0, 1] and lp.stage_of_layer == sorted(lp.stage_of_layer)


def test_align_layers_plans_whole_layers_within_the_rounding_loss():
    p = layered([[10, 10, 10], [5, 5, 30], [10, 10, 10], [1, 1, 1]], devices=3)
    op_plan = solve(p, time_limit_s=5)
    rounded = round_to_layers(p, op_plan)
    aligned = layered([[10, 10, 10], [5, 5, 30], [10, 10, 10], [1, 1, 1]], devices=3)
    assert align_to_layers(aligned) == []  # every module kept whole
    plan = solve(aligned, time_limit_s=5)
    verify_plan(aligned, plan)
    for layer in layer_order(aligned):  # no layer is cut
        stages = {plan.stage_of[v] for v, a in aligned.graph.nodes(data=True) if a.get(MODULE) == layer}
        assert len(stages) == 1, layer
    # The best whole-layer plan is no better than op by op, and no worse than the rounding.
    assert op_plan.bottleneck_ns <= plan.bottleneck_ns <= rounded.rounded_bottleneck_us * 1000
    again = round_to_layers(aligned, plan)
    assert again.aligned and again.rounded_bottleneck_us == pytest.approx(plan.bottleneck_ns / 1000)


def test_rounded_plan_names_modules_of_top_level_weights_and_round_trips():
    p = layered([[10, 10], [10, 10]], extra_weight=True)
    lp = round_to_layers(p, solve(p, time_limit_s=5))
    assert "wpe" in lp.names and lp.modules_outside_layers == ["wpe"]
    assert lp.stage_of_layer[lp.names.index("wpe")] == 0
    assert LayerPlan.from_json(lp.to_json()) == lp


def test_align_without_layers_is_an_error():
    p = layered([[10]])
    for _, a in p.graph.nodes(data=True):
        a.pop(MODULE, None)
    assert round_to_layers(p, solve(p, time_limit_s=5)) is None
    with pytest.raises(HetpartError, match="no submodules"):
        align_to_layers(p)


def test_a_module_called_twice_around_others_is_left_free():
    # blocks.0 -> blocks.1 -> blocks.0 again (a shared module, as T5's dropout): keeping blocks.0
    # whole would pull blocks.1 into its stage.
    p = layered([[10, 10], [10, 10], [10]])
    for v in ("l2_0",):
        p.graph.nodes[v][MODULE] = "blocks.0"
    assert align_to_layers(p) == ["blocks.0"]
    assert all(a.get("colocate") is None for v, a in p.graph.nodes(data=True) if a.get(MODULE) == "blocks.0")
    assert p.graph.nodes["l1_0"]["colocate"] == "layer:blocks.1"


def test_rounding_keeps_independent_branches_on_their_own_stages():
    """An encoder and a decoder embedding side by side (T5): the embedding comes first in the
    topological order but runs on the later stage; rounding must not drag the encoder after it."""
    g = nx.DiGraph()

    def add(name: str, cost: int, module: str | None = None, **attrs) -> None:
        g.add_node(name, **{TIME_NS: {"g": cost}, MEM_BYTES: 0, OUT_BYTES: 8, WEIGHTS: (), PIN: None} | attrs
                   | ({MODULE: module} if module else {}))

    add("x", 0, **{PIN: PIN_FIRST})
    add("d0", 1, "dec.emb")
    add("e0_0", 30, "enc.block.0")
    add("e1_0", 30, "enc.block.1")
    add("j", 50, "dec.block.0")
    add("out", 0, **{PIN: PIN_LAST})
    g.add_edges_from([("x", "d0"), ("x", "e0_0"), ("e0_0", "e1_0"), ("e1_0", "j"), ("d0", "j"), ("j", "out")])
    p = Problem(graph=g, weights={}, devices=[Device(f"d{i}", "g", "m", 1 << 30) for i in range(2)],
                intra_node_links={"m": LINK}, network=LINK)
    assert layer_order(p)[0] == "dec.emb"
    plan = solve(p, time_limit_s=5)
    lp = round_to_layers(p, plan)
    assert lp.aligned and lp.rounded_bottleneck_us == pytest.approx(plan.bottleneck_ns / 1000)
    stage = dict(zip(lp.names, lp.stage_of_layer))
    assert stage["enc.block.0"] == stage["enc.block.1"] == 0 and stage["dec.emb"] == stage["dec.block.0"] == 1
