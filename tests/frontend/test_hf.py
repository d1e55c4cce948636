"""Hugging Face families built from config (random weights, no downloads) through the whole compiler."""

import re

import pytest
import torch

pytest.importorskip("transformers")

from hetpart.cli import main  # noqa: E402
from hetpart.compile import CompileOptions, compile_model  # noqa: E402
from hetpart.errors import HetpartError  # noqa: E402
from hetpart.frontend import ModelSpec, load_model  # noqa: E402
from hetpart.frontend.hf import build_hf, choose_head, small_overrides  # noqa: E402
from hetpart.runtime.artifacts import load_manifest, load_stage  # noqa: E402

REQUIRED = ["gpt2", "bert", "llama", "t5", "vit", "mixtral"]


def spec_of(family: str, batch_size: int = 8) -> ModelSpec:
    return ModelSpec(f"hf:{family}", small_overrides(family), batch_size=batch_size, seq_len=16)


@pytest.mark.parametrize("family", REQUIRED)
def test_family_partitions_and_stage_files_reproduce_every_output(family, tmp_path):
    spec = spec_of(family)
    out = tmp_path / "out"
    # .pt2 export of HF stages is covered by the torchrun test below and benchmarks/hf_families.py
    result = compile_model(spec, "preset:mixed-4", out, CompileOptions(microbatches=4, time_limit_s=1, pt2=False),
                           echo=lambda _: None)
    assert len(result.plan.stages) >= 2
    ranks = load_manifest(out)["ranks"]
    for entry in ranks:  # a torchrun rank imports torch only: no transformers custom ops in a stage
        source = (out / entry["dir"] / "stage.py").read_text()
        assert set(re.findall(r"torch\.ops\.(\w+)\.", source)) <= {"aten"}
    modules = [load_stage(out, entry) for entry in ranks]
    module, inputs = load_model(spec)
    for batch in (spec.batch_size, 3):  # the traced batch and another one
        values = tuple(t[:batch] for t in inputs)
        with torch.no_grad():
            for m in modules:
                values = m(*values)
            want = module(*(t[:batch] for t in inputs))
        assert len(values) == len(want) >= 1
        for got, ref in zip(values, want):
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


@pytest.mark.parametrize(("family", "head", "model_class"), [
    ("gpt2", "causal-lm", "GPT2LMHeadModel"), ("bert", "masked-lm", "BertForMaskedLM"),
    ("t5", "seq2seq-lm", "T5ForConditionalGeneration"), ("vit", "image-classification", "ViTForImageClassification"),
])
def test_head_follows_the_family(family, head, model_class):
    module, _ = build_hf(family, small_overrides(family), batch_size=2, seq_len=8)
    assert choose_head(family, module.model.config) == head
    assert type(module.model).__name__ == model_class


def test_inputs_fit_the_config():
    _, (ids, dec) = build_hf("t5", {**small_overrides("t5"), "vocab_size": "50"}, batch_size=4, seq_len=12)
    assert ids.shape == dec.shape == (4, 12) and int(ids.max()) < 50 and int(dec.max()) < 50
    _, (pixels,) = build_hf("vit", {**small_overrides("vit"), "image_size": "24", "num_channels": "1"},
                            batch_size=2, seq_len=8)
    assert pixels.shape == (2, 1, 24, 24)


def test_small_overrides_reach_aliases_unset_fields_and_family_needs():
    assert small_overrides("qwen3_moe")["num_experts"] == "4"  # the constructor's name for num_local_experts (128)
    assert small_overrides("nemotron")["num_key_value_heads"] == "2"  # None by default
    squeeze = small_overrides("squeezebert")
    assert squeeze["embedding_size"] == squeeze["hidden_size"]  # tied by default, and SqueezeBERT requires it
    module, inputs = build_hf("esm", small_overrides("esm"), batch_size=2, seq_len=8)  # vocab and pad unset
    assert module.model.config.vocab_size == 128 and module.model.config.pad_token_id == 1
    with torch.no_grad():
        assert module(*inputs)[0].shape == (2, 8, 128)


def test_fsmt_source_ids_fit_the_source_vocabulary():
    _, (ids, dec) = build_hf("fsmt", {**small_overrides("fsmt"), "src_vocab_size": "20"}, batch_size=4, seq_len=12)
    assert int(ids.max()) < 20 <= int(dec.max()) < 128  # decoder ids span the target vocabulary (128)


def test_set_converts_to_the_config_type_and_is_deterministic():
    (m1, x1), (m2, x2) = (build_hf("llama", {**small_overrides("llama"), "rms_norm_eps": "0.001",
                                             "tie_word_embeddings": "true"}, 2, 8) for _ in range(2))
    assert m1.model.config.rms_norm_eps == 0.001 and m1.model.config.tie_word_embeddings is True
    assert m1.model.config.num_hidden_layers == 2
    assert torch.equal(x1[0], x2[0])
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))


def test_unknown_set_key_lists_close_matches():
    with pytest.raises(HetpartError, match=r"--set num_hiden_layers: .*close matches: num_hidden_layers"):
        build_hf("llama", {"num_hiden_layers": "2"}, 2, 8)


def test_unknown_model_type_lists_close_matches():
    with pytest.raises(HetpartError, match=r"no model type 'lama'.*close matches: .*llama"):
        load_model(ModelSpec("hf:lama"))


def test_output_structure_names_every_flat_tensor():
    module, inputs = build_hf("t5", small_overrides("t5"), batch_size=2, seq_len=8)
    structure = module.output_structure()  # before any real forward: traced on fake tensors
    assert structure.class_name == "Seq2SeqLMOutput"
    assert structure.keys == ("logits", "encoder_last_hidden_state")
    with torch.no_grad():
        flat = module(*inputs)
    assert structure.describe(flat) == "Seq2SeqLMOutput(logits=2x8x128, encoder_last_hidden_state=2x8x64)"
    rebuilt = structure.rebuild(flat)
    assert type(rebuilt).__name__ == "Seq2SeqLMOutput" and rebuilt.logits is flat[0]
    assert rebuilt.encoder_last_hidden_state is flat[1]


def test_hf_llama_under_torchrun_verifies(tmp_path, capsys):
    out = tmp_path / "out"
    sets = [a for k, v in small_overrides("llama").items() for a in ("--set", f"{k}={v}")]
    assert main(["partition", "hf:llama", *sets, "--cluster", "preset:cpu-2", "--out", str(out),
                 "--batch-size", "4", "--seq-len", "16", "--microbatches", "2", "--time-limit", "2"]) == 0
    capsys.readouterr()
    assert main(["run", str(out), "--verify"]) == 0
    text = capsys.readouterr().out
    assert float(text.split("max_abs_diff=")[1].split()[0]) <= 1e-5
    assert "verify: PASS" in text
    assert "outputs: CausalLMOutputWithPast(logits=4x16x128)" in text  # rebuilt in the model's own structure
