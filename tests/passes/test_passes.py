import operator

import pytest
import torch
import torch.fx as fx

from hetpart.errors import HetpartError
from hetpart.ir import info
from hetpart.partitioner import MEM_BYTES, OUT_BYTES, PIN, PIN_FIRST, PIN_LAST, TIME_NS, WEIGHTS
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from hetpart.passes.flops import _sdpa_flops
from hetpart.passes.op_cost import op_time_ns


def _nodes(gm, target):
    return [n for n in gm.graph.nodes if n.target == target]


def test_linear_flops_and_bytes_at_microbatch_size(annotated):
    gm = annotated("mlp")  # hidden=32, in=64, microbatch 2
    proj = _nodes(gm, torch.ops.aten.linear.default)[0]
    ni = info(proj)
    assert ni.shape == ("s0", "32") and ni.dtype == "f32"
    assert ni.flops == 2 * 2 * 64 * 32
    # input (2x64) + weight (32x64) + bias (32) + output (2x32), fp32
    assert ni.bytes_moved == 4 * (2 * 64 + 32 * 64 + 32 + 2 * 32)
    assert ni.out_bytes == 4 * 2 * 32


def test_views_cost_nothing_and_tuples_are_marked(annotated):
    gm = annotated("gpt-small")
    for n in _nodes(gm, torch.ops.aten.view.default) + _nodes(gm, torch.ops.aten.transpose.int):
        assert info(n).bytes_moved == 0 and set(info(n).cost_ns.values()) == {0}
    split = _nodes(gm, torch.ops.aten.split.Tensor)[0]
    assert info(split).dtype == "tuple" and info(split).out_bytes == 0


def test_causal_sdpa_flops_count_only_kept_pairs():
    q = torch.empty(2, 4, 8, 16, device="meta")
    full = _sdpa_flops((q, q, q, None, 0.0, False), {}, None)
    causal = _sdpa_flops((q, q, q, None, 0.0, True), {}, None)
    assert full == 2 * 2 * 4 * 8 * 8 * 32
    assert causal == full * (8 * 9 // 2) // 64


def test_roofline_is_slower_on_t4_than_a100_for_big_matmuls(annotated, mixed4):
    gm = annotated("gpt-small")
    lm_head = _nodes(gm, torch.ops.aten.linear.default)[-1]
    costs = info(lm_head).cost_ns
    assert costs["t4-16g"] > costs["a100-80g"] > 0
    types = mixed4.device_types
    assert op_time_ns(info(lm_head), types["a100-80g"]) == costs["a100-80g"]


def test_lowering_pins_inputs_and_output_groups_tuples_and_lists_weights(annotated, mixed4):
    gm = annotated("gpt-small")
    problem = lower_to_problem(gm, mixed4)
    g = problem.graph
    assert g.nodes["idx"][PIN] == PIN_FIRST
    assert g.nodes["output"][PIN] == PIN_LAST
    # getitems of a split belong to the split's problem node; scalars are not problem nodes
    assert not any(n.target is operator.getitem and n.name in g for n in gm.graph.nodes)
    assert not any(n.target is torch.ops.aten.sym_size.int and n.name in g for n in gm.graph.nodes)
    split = _nodes(gm, torch.ops.aten.split.Tensor)[0].name
    assert g.nodes[split][OUT_BYTES] == 3 * 2 * 16 * 64 * 4
    # the tied embedding / LM head weight is one weight read by two nodes
    readers = [v for v in g if "lm_head.weight" in g.nodes[v][WEIGHTS]]
    assert len(readers) == 2 and problem.weights["lm_head.weight"] == 128 * 64 * 4
    assert all(set(g.nodes[v][TIME_NS]) == {"a100-80g", "t4-16g"} for v in g)
    assert sum(g.nodes[v][MEM_BYTES] for v in g) > 0
    assert len(problem.devices) == 4


def test_pass_manager_checks_requires_and_names_unknown_passes(annotated):
    from hetpart.passes import OpCostPass

    g = fx.Graph()
    g.output(g.placeholder("x"))
    gm = fx.GraphModule(torch.nn.Module(), g)
    with pytest.raises(HetpartError, match="pass 'op-cost' needs"):
        PassManager([OpCostPass()]).run(gm, PassContext())
    with pytest.raises(HetpartError, match="unknown pass"):
        PassManager(default_passes(), print_after=frozenset({"nope"})).run(gm, PassContext())


def test_dumps_are_numbered_per_pass(tmp_path, mixed4):
    from hetpart.compile import analyze
    from tests.conftest import SMALL

    analyze(SMALL["mlp"], mixed4, 2, dump_dir=tmp_path)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["00-export.txt", "01-shape.txt", "02-flops.txt", "03-memory.txt", "04-op-cost.txt", "graph.json"]


def test_embedding_moves_gathered_rows_not_the_table(annotated):
    gm = annotated("gpt-small")  # vocab 128 x 64, tokens [2, 16]
    emb = _nodes(gm, torch.ops.aten.embedding.default)[0]
    assert info(emb).bytes_moved == 2 * (2 * 16 * 64 * 4) + 2 * 16 * 8


def test_fp32_convolution_runs_at_tf32_rate():
    from hetpart.devices import CATALOG
    from hetpart.ir import NodeInfo

    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    conv = g.call_function(torch.ops.aten.convolution.default, (x, w, None, [1], [0], [1], False, [0], 1))
    mm = g.call_function(torch.ops.aten.mm.default, (x, w))
    ni = NodeInfo(flops=10**12, bytes_moved=1, dtype="f32")
    a100 = CATALOG["a100-80g"]
    assert op_time_ns(ni, a100, conv) * 7 < op_time_ns(ni, a100, mm)  # 156 vs 19.5 TFLOP/s
    t4 = CATALOG["t4-16g"]  # no TF32 units: the same rate
    assert op_time_ns(ni, t4, conv) == op_time_ns(ni, t4, mm)
