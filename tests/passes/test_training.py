"""Training costs: backward formulas per op, lowering for training, and a zoo model trained end to end."""

import json

import pytest
import torch

from hetpart.devices import load_cluster
from hetpart.frontend import export_model
from hetpart.ir import info
from hetpart.partitioner import OUT_BYTES, TIME_NS
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from hetpart.passes.lower import TrainingSpec
from hetpart.passes.op_cost import backward_time_ns, op_time_ns

aten = torch.ops.aten


class TwoLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 32)
        self.fc2 = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def cluster():
    return load_cluster("preset:mixed-4")


def _annotate(cluster, mode: str):
    torch.manual_seed(0)
    gm = export_model(TwoLinear(), (torch.randn(8, 64),))
    ctx = PassContext(device_types=cluster.device_types, batch_size=8, microbatch_size=2, mode=mode)
    return PassManager(default_passes()).run(gm, ctx)


def test_linear_backward_computes_only_the_gradients_it_needs(cluster):
    gm = _annotate(cluster, "training")
    fc1, fc2 = [n for n in gm.graph.nodes if n.target == aten.linear.default]
    relu = next(n for n in gm.graph.nodes if n.target == aten.relu.default)
    # fc1 reads the model input, which needs no gradient: only grad_W (one matmul of the forward's size).
    assert info(fc1).bwd_flops == info(fc1).flops == 2 * 2 * 64 * 32
    # fc2's input comes from fc1: grad_x and grad_W, two matmuls.
    assert info(fc2).bwd_flops == 2 * info(fc2).flops == 2 * (2 * 2 * 32 * 16)
    # Bytes: per needed gradient, grad_out + the other operand read and the gradient written; plus the bias.
    f32 = 4
    out1, x, w1, b1 = 2 * 32 * f32, 2 * 64 * f32, 32 * 64 * f32, 32 * f32
    assert info(fc1).bwd_bytes_moved == (out1 + x + w1) + (out1 + b1)
    # relu is memory-bound: reads grad_out and its saved input, writes the input's gradient.
    assert info(relu).bwd_bytes_moved == 3 * out1 and info(relu).bwd_flops == info(relu).flops
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert info(placeholder).needs_grad is False and info(fc1).needs_grad is True
    a100 = cluster.device_types["a100-80g"]
    assert info(fc2).bwd_cost_ns["a100-80g"] == backward_time_ns(info(fc2), a100, fc2)
    assert info(fc2).cost_ns["a100-80g"] == op_time_ns(info(fc2), a100, fc2)


def test_training_problem_costs_more_than_inference(cluster):
    inference = lower_to_problem(_annotate(cluster, "inference"), cluster)
    gm = _annotate(cluster, "training")
    training = lower_to_problem(gm, cluster, TrainingSpec("1f1b", 4, optimizer_bytes_per_param=8))
    for v in inference.graph:
        for t, ns in inference.graph.nodes[v][TIME_NS].items():
            node = next(n for n in gm.graph.nodes if n.name == v)
            assert training.graph.nodes[v][TIME_NS][t] == ns + info(node).bwd_cost_ns.get(t, 0)
    assert training.graph.nodes["linear"][TIME_NS]["t4-16g"] > inference.graph.nodes["linear"][TIME_NS]["t4-16g"]
    # Activations that need a gradient send it back: twice the bytes; the input sends none back.
    assert training.graph.nodes["relu"][OUT_BYTES] == 2 * inference.graph.nodes["relu"][OUT_BYTES]
    assert training.graph.nodes["x"][OUT_BYTES] == inference.graph.nodes["x"][OUT_BYTES]
    assert training.network.latency_ns == 2 * inference.network.latency_ns
    # Adam: the gradient (4 bytes) and 8 bytes of state per fp32 parameter.
    assert training.training.state_bytes["fc1.weight"] == 3 * inference.weights["fc1.weight"]
    assert inference.training is None


def test_sdpa_backward_is_five_matmuls_of_the_forwards_two(cluster):
    from hetpart.compile import analyze
    from tests.conftest import SMALL

    gm = analyze(SMALL["gpt-small"], cluster, 2, mode="training")[0]
    sdpa = next(n for n in gm.graph.nodes if n.target == aten.scaled_dot_product_attention.default)
    assert info(sdpa).bwd_flops == info(sdpa).flops * 5 // 2  # head dim = value dim
    emb = next(n for n in gm.graph.nodes if n.target == aten.embedding.default)
    assert info(emb).bwd_bytes_moved >= info(next(a for a in emb.all_input_nodes if a.op == "get_attr")).param_bytes
    idx = next(n for n in gm.graph.nodes if n.op == "placeholder")
    assert not info(idx).needs_grad and not info(idx).bwd_flops


def test_zoo_model_partitioned_for_training_runs_1f1b_and_verifies(training_1f1b_run, capsys):
    # gpt-small partitioned with --mode training --schedule 1f1b on cpu-2, and its 1F1B training step
    # with --verify: one launch with tests/runtime/test_torchrun.py's tied-weights test (NOTE [shared
    # launches] in tests/shared_runs.py).
    from hetpart.cli import main

    out = training_1f1b_run.out
    table = training_1f1b_run.partition_text
    assert "training with 1F1B" in table and "(1F1B, simulated)" in table
    plan = json.loads((out / "plan.json").read_text())
    assert plan["mode"] == "training" and plan["schedule"] == "1f1b" and plan["optimizer_bytes_per_param"] == 8
    for s in plan["stages"]:
        assert s["backward_us"] > 0 and abs(s["forward_us"] + s["backward_us"] - s["compute_us"]) < 0.01
    assert main(["inspect", str(out)]) == 0
    assert "training with 1F1B" in capsys.readouterr().out
    assert "verify: PASS" in training_1f1b_run.run_text

