"""Dynamic sequence length: which models export with it, the static fallback, and partitioned models run
at another batch and sequence length (stage.py, stage.pt2 and the worker's static metadata)."""

from pathlib import Path

import networkx as nx
import pytest
import torch

from hetpart.codegen import split_stages
from hetpart.compile import CompileOptions, compile_model
from hetpart.devices import load_cluster
from hetpart.frontend import ModelSpec, SequenceAxes, export_model, load_model, sequence_axes
from hetpart.ir import info
from hetpart.passes import PassContext, PassManager, default_passes, lower_to_problem
from hetpart.runtime.artifacts import load_manifest, load_stage, read_json, symbol_sizes
from hetpart.runtime.launch import RunOptions, reference_model, run_spec
from hetpart.runtime.worker import _static_metadata
from hetpart.runtime.pt2 import load_pt2

GPT_SMALL = ModelSpec("zoo:gpt-small", {"n_layer": "2", "n_embd": "32", "n_head": "4", "vocab_size": "64",
                                        "block_size": "32"}, batch_size=4, seq_len=16)


def hf_spec(family: str, **sizes: str) -> ModelSpec:
    from hetpart.frontend.hf import small_overrides

    return ModelSpec(f"hf:{family}", {**small_overrides(family), **sizes}, batch_size=4, seq_len=16)


def dynamic_of(spec: ModelSpec) -> dict:
    module, inputs = load_model(spec)
    return export_model(module, inputs, seq=sequence_axes(spec, inputs)).meta["dynamic"]


@pytest.mark.parametrize(("family", "seq_max"), [
    ("gpt2", 64), ("bert", 64), ("llama", 64), ("t5", None), ("mixtral", 64),
])
def test_text_families_export_with_a_dynamic_sequence(family, seq_max):
    pytest.importorskip("transformers")
    assert dynamic_of(hf_spec(family)) == {"batch": True, "seq_len": True, "why": None,
                                           **({"seq_len_max": seq_max} if seq_max else {})}


def test_images_have_no_sequence_dimension():
    pytest.importorskip("transformers")
    dynamic = dynamic_of(hf_spec("vit"))
    assert dynamic["batch"] and not dynamic["seq_len"]
    assert "no input has a sequence dimension" in dynamic["why"]


def test_sequence_axes_are_the_inputs_that_follow_seq_len():
    bert = ModelSpec("zoo:bert", {"max_position": "20"}, batch_size=4, seq_len=20)
    axes = sequence_axes(bert, load_model(bert)[1])  # at its limit: probed one token shorter
    assert axes == SequenceAxes((True, True, True), max=20)
    mlp = ModelSpec("zoo:mlp", {"hidden": "16"}, batch_size=4, seq_len=16)
    assert not any(sequence_axes(mlp, load_model(mlp)[1]).inputs)


def test_a_model_that_specializes_the_length_falls_back_to_a_static_one():
    lstm = ModelSpec("zoo:lstm", {"vocab_size": "64", "embed_dim": "8", "hidden": "8", "n_layer": "1"},
                     batch_size=4, seq_len=6)
    dynamic = dynamic_of(lstm)  # the time steps are unrolled in Python
    assert dynamic["batch"] and not dynamic["seq_len"]
    assert "torch.export refused a dynamic sequence length" in dynamic["why"]
    assert "specialized it to be a constant (6)" in dynamic["why"]


class FlattenedMLP(torch.nn.Module):
    """Runs its MLP on [B*L, D] (as HF GPT-2 and OPT do) and adds a per-sample mean back."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        pooled = x.mean(1)
        flat = torch.relu(self.up(x.reshape(b * length, d)))
        return self.down(flat).view(b, length, d) + pooled[:, None]


def test_a_stage_that_receives_only_flattened_values_recomputes_both_sizes():
    """Stage 1 of some cuts receives [s0*s1, 16] and [s0, 8]: it gets s0 from the second and s1 = (s0*s1) // s0."""
    module = FlattenedMLP().eval()
    x = torch.randn(4, 6, 8)
    gm = export_model(module, (x,), seq=SequenceAxes((True,)))
    assert gm.meta["dynamic"]["seq_len"]
    cluster = load_cluster("preset:cpu-2")
    gm = PassManager(default_passes(), echo=lambda _: None).run(gm, PassContext(cluster.device_types, 4, 2))
    problem = lower_to_problem(gm, cluster)
    order = list(nx.lexicographical_topological_sort(problem.graph))
    pins = {v: {"first": 0, "last": 1}[pin] for v, pin in problem.graph.nodes(data="pin") if pin}
    other = torch.randn(3, 11, 8)
    flattened_only = 0
    for cut in range(1, len(order)):
        stage_of = {v: pins.get(v, int(i >= cut)) for i, v in enumerate(order)}
        stages = split_stages(gm, stage_of, 2)
        shapes = {n.name: info(n).shape for n in gm.graph.nodes}
        received = [shapes[v] for v in stages[1].inputs]
        flattened_only += any(s == ("s0*s1", "16") for s in received) and not any("s1" in s for s in received)
        with torch.no_grad():
            got = stages[1].gm(*stages[0].gm(other))
        torch.testing.assert_close(got[0], module(other), rtol=0, atol=1e-6)
    assert flattened_only, "some cut sends only the flattened activation and the per-sample mean"


def run_in_process(out: Path, batch: int, seq: int) -> None:
    """Run the generated stage.py files back to back at (batch, seq), against the model built at those sizes;
    each rank's static metadata (what the worker gives pipelining) has the shapes the stages make."""
    plan, manifest = read_json(out / "plan.json"), load_manifest(out)
    spec = run_spec(ModelSpec.from_json(plan["model"]), plan["dynamic"], RunOptions(batch_size=batch, seq_len=seq))
    module, inputs = reference_model(out, manifest, spec)
    assert inputs[0].shape[:2] == (batch, seq)
    sizes = symbol_sizes(manifest, batch, seq)
    values = inputs
    with torch.no_grad():
        for entry in manifest["ranks"]:
            static = _static_metadata(manifest, entry, sizes, torch.device("cpu"))
            assert static is not None
            assert [t.shape for t in static["input_args"]] == [t.shape for t in values]
            values = load_stage(out, entry)(*values)
            assert [t.shape for t in static["output_args"]] == [t.shape for t in values]
            assert [t.dtype for t in static["output_args"]] == [t.dtype for t in values]
        want = module(*inputs)
    for got, ref in zip(values, want if isinstance(want, tuple) else (want,), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize("spec", [GPT_SMALL, "hf:gpt2"], ids=["zoo:gpt-small", "hf:gpt2"])
def test_partitioned_at_16_runs_at_another_batch_and_length(spec, tmp_path):
    if spec == "hf:gpt2":  # flattens [B, L, D] to [B*L, D] around its MLPs: `s0*s1` crosses cuts
        pytest.importorskip("transformers")
        spec = hf_spec("gpt2", n_layer="2", n_embd="32", n_positions="32")
    out = tmp_path / "out"
    compile_model(spec, "preset:mixed-4", out, CompileOptions(microbatches=2, time_limit_s=1), echo=lambda _: None)
    assert read_json(out / "plan.json")["dynamic"] == {"batch": True, "seq_len": True, "why": None, "seq_len_max": 32}
    manifest = load_manifest(out)
    assert manifest["ranks"][0]["inputs"][0]["shape"] == ["s0", "s1"]
    for batch, seq in ((4, 16), (6, 24), (2, 5)):
        run_in_process(out, batch, seq)
    # each rank's .pt2 takes the other sizes too, `s0*s1` included
    sizes = symbol_sizes(manifest, 3, 24)
    values = load_model(run_spec(ModelSpec.from_json(read_json(out / "plan.json")["model"]),
                                 read_json(out / "plan.json")["dynamic"], RunOptions(batch_size=3, seq_len=24)))[1]
    for entry in manifest["ranks"]:
        program = load_pt2(out, entry)
        with torch.no_grad():
            values = program(*values)
        expected = _static_metadata(manifest, entry, sizes, torch.device("cpu"))["output_args"]
        assert [v.shape for v in values] == [t.shape for t in expected]


class OnlyFlattened(torch.nn.Module):
    """Its MLP runs on [B*L, D] and nothing else per sample survives: a cut inside sends only `s0*s1` sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        return self.down(torch.relu(self.up(x.reshape(b * length, d)))).view(b, length, d)


def test_a_stage_that_cannot_recompute_its_sizes_gets_the_model_input_that_has_them():
    """NOTE [size carriers]: stage 1 gets x ([s0, s1, 8]) passed on besides the flattened activation."""
    module = OnlyFlattened().eval()
    gm = export_model(module, (torch.randn(4, 6, 8),), seq=SequenceAxes((True,)))
    cluster = load_cluster("preset:cpu-2")
    gm = PassManager(default_passes(), echo=lambda _: None).run(gm, PassContext(cluster.device_types, 4, 2))
    problem = lower_to_problem(gm, cluster)
    order = list(nx.lexicographical_topological_sort(problem.graph))
    pins = {v: {"first": 0, "last": 1}[pin] for v, pin in problem.graph.nodes(data="pin") if pin}
    shapes = {n.name: info(n).shape for n in gm.graph.nodes}
    other = torch.randn(3, 11, 8)
    carried = 0
    for cut in range(1, len(order)):
        stages = split_stages(gm, {v: pins.get(v, int(i >= cut)) for i, v in enumerate(order)}, 2)
        assert stages[0].outputs == stages[1].inputs
        received = [shapes[v] for v in stages[1].inputs]
        # after the reshape, x is read for its sizes only: it crosses as a size carrier
        carried += "x" in stages[1].inputs and any(s[0] == "s0*s1" for s in received)
        with torch.no_grad():
            got = stages[1].gm(*stages[0].gm(other))
        torch.testing.assert_close(got[0], module(other), rtol=0, atol=1e-6)
    assert carried, "some cut sends only flattened values, and the model input with them"
