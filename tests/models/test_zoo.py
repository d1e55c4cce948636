"""Every zoo model, tiny: export, partition onto mixed-4, and the generated stage.py files equal the model.

Two splits per model: the solver's plan (through `compile_model`, as the CLI
does) and a forced contiguous 4-stage split, so that skip values (residuals,
U-Net skips, the timestep embedding, recurrent states, id bags) cross cuts.
Both run at the traced batch and another (and another length where it is dynamic). Runs of these configs
under a real torchrun are recorded in docs/models.md (4 ranks take about a
minute on a 2-core machine, too slow for the suite; tests/runtime has its own).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import hetpart.compile

from hetpart.codegen import manifest, split_stages, write_json, write_manifest, write_rank
from hetpart.codegen.artifacts import PlannedDevice
from hetpart.compile import CompileOptions, analyze, compile_model
from hetpart.frontend import ModelSpec, export_model, load_model, sequence_axes
from hetpart.ir import info
from hetpart.models import ZOO, build_zoo
from hetpart.passes import lower_to_problem
from hetpart.runtime.artifacts import load_manifest, load_stage
from tests.codegen.test_split import contiguous_plan

TRACED_BATCH = 4
OTHER_BATCH = 3
TRACED_SEQ = 6
OTHER_SEQ = 5

TINY = {
    "mlp": {"n_blocks": "3", "hidden": "32"},
    "gpt-small": {"n_layer": "2", "n_embd": "32", "n_head": "4", "vocab_size": "64", "block_size": "16"},
    "glm": {"n_categorical": "3", "vocab_size": "50", "n_dense": "5", "embed_dim": "4"},
    "resnet": {"image_size": "8", "base_width": "8", "n_stages": "2", "blocks_per_stage": "1"},
    "vit": {"image_size": "8", "patch_size": "4", "dim": "32", "n_layers": "2", "n_heads": "4", "mlp_dim": "64"},
    "unet": {"image_size": "8", "base_channels": "8", "n_levels": "2", "groups": "4"},
    "lstm": {"vocab_size": "64", "embed_dim": "16", "hidden": "16", "n_layer": "2"},
    "llama": {"vocab_size": "64", "dim": "32", "n_layers": "2", "n_heads": "4", "n_kv_heads": "2", "ffn_hidden": "64"},
    "moe": {"vocab_size": "64", "dim": "32", "n_layers": "1", "n_heads": "4", "n_kv_heads": "2", "ffn_hidden": "32",
            "n_experts": "3"},
    "bert": {"vocab_size": "64", "hidden": "32", "n_layers": "2", "n_heads": "4", "intermediate": "64"},
    "t5": {"vocab_size": "64", "dim": "32", "n_layers": "1", "n_heads": "4", "d_ff": "64", "num_buckets": "8",
           "max_distance": "16"},
    "hgnn": {"n_authors": "6", "n_papers": "10", "n_writes": "15", "n_cites": "20", "in_features": "8",
             "hidden": "16", "num_classes": "3"},
}
NAMES = sorted(TINY)
# Models whose 4-stage split has an intermediate stage that forwards a value it received: a long skip
# (mlp's input projection, unet's timestep embedding and skips, glm's id bags, hgnn's features of the
# other node type), a layer input read one step later (lstm), or a residual whose block spans a
# whole stage (llama, moe, t5).
LONG_SKIPS = {"mlp", "unet", "llama", "moe", "t5", "hgnn", "lstm", "glm"}
# Models whose sequence length is dynamic (NOTE [dynamic sequence length]); lstm unrolls its time
# steps, so export specializes the length, and the others have no sequence dimension.
DYNAMIC_SEQ = {"gpt-small", "llama", "moe", "bert", "t5"}


def spec(name: str, seq_len: int = TRACED_SEQ) -> ModelSpec:
    return ModelSpec(f"zoo:{name}", TINY[name], batch_size=TRACED_BATCH, seq_len=seq_len)


@pytest.fixture(scope="module")
def traced():
    """name -> the model's exported graph, exported once and shared by both splits of this module.

    Export dominates the time of these tests, so `compile_model` and `analyze` get the cached graph
    (through `hetpart.compile.export_model`); everything after export runs for real each time.
    """
    cache: dict[str, torch.fx.GraphModule] = {}

    def get(name: str) -> torch.fx.GraphModule:
        if name not in cache:
            module, inputs = load_model(spec(name))
            cache[name] = export_model(module, inputs, seq=sequence_axes(spec(name), inputs))
        return cache[name]

    return get


@pytest.fixture
def export_once(traced, monkeypatch):
    """Make the pipeline's export step return the cached graph of `name` (same spec, same weights)."""

    def use(name: str) -> None:
        gm = traced(name)
        monkeypatch.setattr(hetpart.compile, "export_model", lambda module, inputs, **kw: gm)

    return use


def run_generated(out: Path, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """Import every rank's stage.py from `out` and run them back to back in this process."""
    values = inputs
    with torch.no_grad():
        for entry in load_manifest(out)["ranks"]:
            values = load_stage(out, entry)(*values)
    return values


def assert_matches_model(out: Path, name: str, dynamic_seq: bool) -> None:
    """The stage files equal the model at the traced batch and another, and (dynamic_seq) another length."""
    assert dynamic_seq == (name in DYNAMIC_SEQ)
    for seq in (TRACED_SEQ, OTHER_SEQ) if dynamic_seq else (TRACED_SEQ,):
        module, inputs = load_model(spec(name, seq))  # the same weights: the seed builds them first
        for batch in (TRACED_BATCH, OTHER_BATCH):
            x = tuple(t[:batch] for t in inputs)
            with torch.no_grad():
                expected = module(*x)
            got = run_generated(out, x)
            assert len(got) == 1
            torch.testing.assert_close(got[0], expected, rtol=0, atol=1e-5)


def test_every_small_zoo_model_is_covered():
    assert set(TINY) == {name for name, m in ZOO.items() if not m.meta_only}


@pytest.mark.parametrize("name", NAMES)
def test_partitioned_stage_files_reproduce_the_model(name, tmp_path, export_once):
    export_once(name)
    out = tmp_path / "out"
    # A short time limit: a feasible plan is as good as an optimal one for checking the numbers.
    result = compile_model(spec(name), "preset:mixed-4", out, CompileOptions(microbatches=2, time_limit_s=1),
                           echo=lambda _: None)
    assert result.plan.solver_status in {"OPTIMAL", "FEASIBLE"}
    assert_matches_model(out, name, result.plan_json["dynamic"]["seq_len"])


@pytest.mark.parametrize("name", NAMES)
def test_forced_four_stage_split_reproduces_the_model(name, tmp_path, mixed4, export_once):
    export_once(name)
    gm = analyze(spec(name), mixed4, microbatch_size=2, echo=lambda _: None)[0]
    stages = split_stages(gm, contiguous_plan(lower_to_problem(gm, mixed4), 4), 4)
    for a, b in zip(stages, stages[1:]):
        assert a.outputs == b.inputs
    assert any(len(s.outputs) >= 2 for s in stages[:-1]), "a residual or skip crosses a cut besides the activation"
    # Only per-sample values are sent (their shapes have a batch symbol, s0 or an expression of it):
    # batch-free ones, such as RoPE tables and position biases, are recomputed where they are read.
    shape_of = {n.name: info(n).shape for n in gm.graph.nodes}
    assert all(any(not d.isdigit() for d in shape_of[v]) for s in stages[:-1] for v in s.outputs)
    if name in LONG_SKIPS:  # some intermediate stage forwards a value it received
        assert any(set(s.inputs) & set(s.outputs) for s in stages[1:-1])
    out = tmp_path / "out"
    files = [write_rank(out / f"rank{s.index}", s, f"stage {s.index}") for s in stages]
    devices = [PlannedDevice(f"host/{s.index}", "cpu", "host") for s in stages]
    write_json(out / "plan.json", {})  # the manifest lists and hashes it; run_generated reads only the ranks
    write_manifest(out, manifest(stages, files, devices))
    assert_matches_model(out, name, gm.meta["dynamic"]["seq_len"])


@pytest.mark.parametrize(("name", "params"), [("llama-7b", 6_738_415_616), ("llama-70b", 68_976_648_192)])
def test_large_llama_configs_are_meta_only_with_llama2_sizes(name, params):
    assert ZOO[name].meta_only
    module, inputs = build_zoo(name, {}, batch_size=2, seq_len=8)
    assert all(p.is_meta for p in module.parameters())  # no weight memory
    assert sum(p.numel() for p in module.parameters()) == params  # the published Llama-2 parameter counts
    assert inputs[0].shape == (2, 8) and not inputs[0].is_meta


def test_models_command_lists_every_model_with_its_domain(capsys):
    from hetpart.cli import main

    assert main(["models"]) == 0
    shown = capsys.readouterr().out
    for m in ZOO.values():
        assert m.name in shown and m.domain in shown
