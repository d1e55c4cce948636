"""Codegen numerics in one process: stage GraphModules and generated stage.py files."""

import networkx as nx
import pytest
import torch

from hetpart.codegen import run_stages, split_stages
from hetpart.compile import CompileOptions, compile_model
from hetpart.frontend import load_model
from hetpart.partitioner.costs import boundary_bytes
from hetpart.partitioner.problem import OUT_TENSORS
from hetpart.passes import lower_to_problem
from hetpart.runtime.artifacts import load_manifest, load_stage
from tests.conftest import SMALL


def contiguous_plan(problem, num_stages: int) -> dict[str, int]:
    """Cut one topological order into `num_stages` equal runs (inputs first, output last)."""
    order = list(nx.lexicographical_topological_sort(problem.graph))
    stage_of = {v: min(num_stages - 1, i * num_stages // len(order)) for i, v in enumerate(order)}
    for v, pin in problem.graph.nodes(data="pin"):
        if pin == "first":
            stage_of[v] = 0
        elif pin == "last":
            stage_of[v] = num_stages - 1
    return stage_of


@pytest.mark.parametrize("name", ["mlp", "gpt-small"])
@pytest.mark.parametrize("num_stages", [2, 4])
def test_stages_back_to_back_equal_the_model(name, num_stages, annotated, mixed4):
    gm = annotated(name)
    stages = split_stages(gm, contiguous_plan(lower_to_problem(gm, mixed4), num_stages), num_stages)
    module, inputs = load_model(SMALL[name])
    for batch in (inputs[0].shape[0], 3):  # the traced batch and another one
        x = tuple(t[:batch] for t in inputs)
        with torch.no_grad():
            torch.testing.assert_close(run_stages(stages, *x)[0], module(*x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("num_stages", [2, 3, 4])
def test_a_boundary_sends_as_many_tensors_as_lowering_counts(num_stages, annotated, mixed4):
    """NOTE [stage time]: each tensor crossing a boundary is a value of its own (a latency each); a
    multi-output op's parts are one problem node of OUT_TENSORS tensors. The cut right after
    gpt-small's qkv split sends its three parts."""
    gm = annotated("gpt-small")
    problem = lower_to_problem(gm, mixed4)
    assert problem.graph.nodes["split"][OUT_TENSORS] == 3
    order = list(nx.lexicographical_topological_sort(problem.graph))
    plans = [contiguous_plan(problem, num_stages)]
    if num_stages == 2:
        after = order.index("split") + 1
        plans.append({v: int(i >= after) for i, v in enumerate(order)})
    for stage_of in plans:
        stages = split_stages(gm, stage_of, num_stages)
        assert [len(s.outputs) for s in stages[:-1]] == boundary_bytes(problem, stage_of, num_stages, weight=OUT_TENSORS)
    assert {"getitem", "getitem_1", "getitem_2"} <= set(stages[0].outputs) or num_stages > 2


def test_skip_values_pass_through_intermediate_stages(annotated, mixed4):
    gm = annotated("mlp")
    stages = split_stages(gm, contiguous_plan(lower_to_problem(gm, mixed4), 4), 4)
    # relu(proj(x)) feeds the head in the last stage: every stage in between receives and forwards it
    for s in stages[1:-1]:
        assert "relu" in s.inputs and "relu" in s.outputs
    for a, b in zip(stages, stages[1:]):
        assert a.outputs == b.inputs


def test_each_stage_holds_only_the_weights_it_reads(annotated, mixed4):
    gm = annotated("gpt-small")
    stages = split_stages(gm, contiguous_plan(lower_to_problem(gm, mixed4), 4), 4)
    first, last = stages[0], stages[-1]
    assert "lm_head.weight" in first.weights.values()  # tied: the embedding reads it
    assert "lm_head.weight" in last.weights.values()  # and the LM head
    assert not any("blocks.1" in w for w in first.weights.values())


@pytest.mark.parametrize("name", ["mlp", "gpt-small"])
def test_generated_stage_files_reproduce_the_model(name, tmp_path):
    out = tmp_path / "out"
    compile_model(SMALL[name], "preset:mixed-4", out, CompileOptions(microbatches=4, time_limit_s=20))
    manifest = load_manifest(out)
    modules = [load_stage(out, entry) for entry in manifest["ranks"]]
    for entry in manifest["ranks"]:
        source = (out / entry["dir"] / "stage.py").read_text()
        imports = {line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))}
        assert imports <= {"math", "pathlib", "torch", "safetensors", "safetensors.torch"}  # safe_open: NOTE [weights stored once]
    module, inputs = load_model(SMALL[name])
    for batch in (inputs[0].shape[0], 5):
        values = tuple(t[:batch] for t in inputs)
        with torch.no_grad():
            for m in modules:
                values = m(*values)
            torch.testing.assert_close(values[0], module(*inputs)[:batch], rtol=0, atol=1e-5)
