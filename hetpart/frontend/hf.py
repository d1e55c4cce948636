"""`hf:MODEL_TYPE`: a Hugging Face transformers model built from its config class, random weights.

No downloads: the config is transformers' default for the model type
(`AutoConfig.for_model`), changed with `--set KEY=VALUE`, and the weights are
initialised from the seed. The head follows the family: seq2seq LM for
encoder-decoders, image classification for vision models, masked LM for
encoders, causal LM for decoders, the bare model otherwise.

The pipeline needs a flat tuple of tensors out, HF returns a `ModelOutput`: the
model is wrapped in `HFModel`, whose forward returns the output's tensor leaves
(None dropped) and remembers the structure (`OutputStructure`) so a runner can
rebuild the original `ModelOutput` for the user.

    >>> module, inputs = build_hf("gpt2", {"n_layer": "1", "n_embd": "32", "n_head": "2", "vocab_size": "64"},
    ...                           batch_size=2, seq_len=8)
    >>> type(module.model).__name__, tuple(inputs[0].shape)
    ('GPT2LMHeadModel', (2, 8))
    >>> [t.shape for t in module(*inputs)]
    [torch.Size([2, 8, 64])]
    >>> module.output_structure()
    OutputStructure(class_name='CausalLMOutputWithCrossAttentions', keys=('logits',))
"""

from __future__ import annotations

import difflib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from hetpart.errors import HetpartError
from hetpart.models import convert_override

# No network, ever: configs come from the installed transformers, weights from the seed.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HEADS = ("seq2seq-lm", "image-classification", "masked-lm", "causal-lm", "base")


@dataclass(frozen=True)
class OutputStructure:
    """How the flat output tensors map back to the model's own output.

    `class_name` is the ModelOutput (or tuple/dict) type; `keys` name each flat
    tensor by its pytree path in that output (`logits`, `hidden_states[1]`).
    """

    class_name: str
    keys: tuple[str, ...]
    output_type: type | None = field(default=None, compare=False, repr=False)

    def named(self, outputs: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        """The flat tensors named by their place in the original output."""
        if len(outputs) != len(self.keys):
            raise HetpartError(f"{self.class_name} has {len(self.keys)} tensors, got {len(outputs)}")
        return dict(zip(self.keys, outputs))

    def rebuild(self, outputs: tuple[torch.Tensor, ...]) -> Any:
        """The model's own output type (`CausalLMOutputWithPast(logits=...)`) where every key is a
        field of it; otherwise the named dict."""
        named = self.named(outputs)
        if self.output_type in (list, tuple):  # a file model's list output (NOTE [model outputs] in export.py)
            return self.output_type(outputs)
        if self.output_type is not None and all(k.isidentifier() for k in named):
            return self.output_type(**named)
        return named

    def describe(self, outputs: tuple[torch.Tensor, ...]) -> str:
        """`CausalLMOutput(logits=8x32x128)`."""
        fields = ", ".join(f"{k}={'x'.join(map(str, t.shape))}" for k, t in self.named(outputs).items())
        return f"{self.class_name}({fields})"


# Families that make their all-ones attention mask only when not traced (`attention_mask is None and not
# is_torchdynamo_compiling()`) and fail under torch.export without one: the wrapper passes it.
MASKED_WHEN_TRACED = frozenset({"switch_transformers", "longt5"})


def _key_name(path: tuple) -> str:
    return pytree.keystr(path).removeprefix(".").replace("['", "").replace("']", "")


class HFModel(nn.Module):
    """A transformers model returning its output's tensor leaves; subclasses name the inputs."""

    checkpoint_prefix = "model."  # the model's own checkpoints name its weights without the wrapper's prefix

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self._structure: OutputStructure | None = None
        self._example: tuple[torch.Tensor, ...] | None = None

    def flat_outputs(self, **inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from transformers.utils import ModelOutput

        if getattr(self.model.config, "model_type", None) in MASKED_WHEN_TRACED:
            inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
        out = self.model(**inputs)
        leaves = pytree.tree_flatten_with_path(out)[0]
        kept = [(path, x) for path, x in leaves if isinstance(x, torch.Tensor)]
        kind = type(out) if isinstance(out, ModelOutput) else None
        self._structure = OutputStructure(type(out).__name__, tuple(_key_name(p) for p, _ in kept), kind)
        return tuple(x for _, x in kept)

    def output_structure(self) -> OutputStructure:
        """The structure of the output; if forward has not run yet, traced on fake tensors (no compute),
        or where an op has no fake kernel for these dtypes (Mixtral's grouped_mm), run on one sample."""
        if self._structure is None:
            from torch._subclasses.fake_tensor import FakeTensorMode

            assert self._example is not None
            with torch.no_grad():
                try:
                    with FakeTensorMode(allow_non_fake_inputs=True):
                        self(*self._example)
                except Exception:  # noqa: BLE001 - any fake-mode gap; the real forward below is the answer
                    self(*(x[:1] for x in self._example))
        assert self._structure is not None
        return self._structure


class TextModel(HFModel):
    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.flat_outputs(input_ids=input_ids)


class Seq2SeqModel(HFModel):
    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.flat_outputs(input_ids=input_ids, decoder_input_ids=decoder_input_ids)


class VisionModel(HFModel):
    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.flat_outputs(pixel_values=pixel_values)


# Positional input names -> the wrapper whose forward takes them in that order.
WRAPPERS: dict[tuple[str, ...], type[HFModel]] = {
    ("input_ids",): TextModel, ("input_ids", "decoder_input_ids"): Seq2SeqModel, ("pixel_values",): VisionModel,
}


def _config(model_type: str, overrides: dict[str, str]) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING_NAMES:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=5)
        hint = f"close matches: {', '.join(close)}" if close else "see transformers' model types"
        raise HetpartError(f"model 'hf:{model_type}': transformers has no model type '{model_type}' ({hint})")
    config = AutoConfig.for_model(model_type)
    known = sorted(config.to_dict())
    for key, raw in overrides.items():
        if key not in known and not hasattr(config, key):
            close = difflib.get_close_matches(key, known, n=5)
            raise HetpartError(
                f"--set {key}: hf:{model_type} config ({type(config).__name__}) has no field '{key}' "
                f"({'close matches: ' + ', '.join(close) if close else 'fields: ' + ', '.join(known[:20]) + ', ...'})"
            )
        setattr(config, key, convert_override(key, raw, getattr(config, key, None)))
    config.use_cache = False
    if getattr(config, "architectures", None) is None:  # auto classes with several heads iterate over it
        config.architectures = []
    return config


def _is_vision(model_type: str, config: Any) -> bool:
    from transformers.models.auto import modeling_auto as auto

    return hasattr(config, "num_channels") and model_type in auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES


def choose_head(model_type: str, config: Any) -> str:
    """Which head `hf:model_type` gets (one of HEADS)."""
    from transformers.models.auto import modeling_auto as auto

    if getattr(config, "is_encoder_decoder", False) and model_type in auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return "seq2seq-lm"
    if _is_vision(model_type, config):
        return "image-classification"
    if model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return "masked-lm"
    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal-lm"
    return "base"


def _has_experts(config: Any) -> bool:
    return any(isinstance(getattr(config, k, None), int) and getattr(config, k) > 1
               for k in ("num_local_experts", "num_experts", "n_routed_experts"))


def _auto_class(head: str) -> Any:
    import transformers as tf

    return {"seq2seq-lm": tf.AutoModelForSeq2SeqLM, "image-classification": tf.AutoModelForImageClassification,
            "masked-lm": tf.AutoModelForMaskedLM, "causal-lm": tf.AutoModelForCausalLM, "base": tf.AutoModel}[head]


def example_inputs(config: Any, head: str, batch_size: int, seq_len: int,
                   generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Inputs that fit the config: token ids below the vocabulary, images of the configured size."""
    if head == "image-classification":
        size = getattr(config, "image_size", 224)  # CNNs (resnet, ...) take any size; ImageNet's is the usual
        h, w = (size, size) if isinstance(size, int) else tuple(size)
        return {"pixel_values": torch.randn(batch_size, config.num_channels, h, w, generator=generator)}
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if isinstance(limit, int) and seq_len > limit:
        raise HetpartError(f"--seq-len {seq_len} exceeds the model's {limit} positions "
                           f"(raise it with --set max_position_embeddings=N or lower --seq-len)")
    # FSMT has a vocabulary per side: its `vocab_size` is the target's
    source_vocab = getattr(config, "src_vocab_size", None) or config.vocab_size
    ids = torch.randint(0, source_vocab, (batch_size, seq_len), generator=generator)
    inputs = {"input_ids": ids}
    if head == "seq2seq-lm":
        inputs["decoder_input_ids"] = torch.randint(0, config.vocab_size, (batch_size, seq_len), generator=generator)
    return inputs


def build_hf(model_type: str, overrides: dict[str, str], batch_size: int, seq_len: int,
             seed: int = 0) -> tuple[HFModel, tuple[torch.Tensor, ...]]:
    """The `hf:model_type` model (deterministic for `seed`) wrapped in HFModel, and its example inputs.

    NOTE [HF kernels]: sdpa attention exports to one aten op the cost model knows; eager is the
    fallback for families without an sdpa kernel. Mixture-of-experts layers use `batched_mm`: the
    default `grouped_mm` exports to transformers' own custom op, which a stage.py (torch only)
    cannot run.
    """
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise HetpartError("hf: models need transformers; install it with `pip install 'hetpart[hf]'`") from None
    config = _config(model_type, overrides)
    head = choose_head(model_type, config)
    # sdpa, else eager; experts as batched_mm (NOTE [HF kernels]).
    experts = {"experts_implementation": "batched_mm"} if _has_experts(config) else {}
    torch.manual_seed(seed)
    try:
        try:
            model = _auto_class(head).from_config(config, attn_implementation="sdpa", **experts)
        except ValueError:
            torch.manual_seed(seed)
            model = _auto_class(head).from_config(config, attn_implementation="eager", **experts)
    except HetpartError:
        raise
    except Exception as err:  # transformers raises many types; a bad --set combination is the usual cause
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise HetpartError(f"hf:{model_type}: building the model from its config failed: "
                           f"{type(err).__name__}: {first}\n  what to try: check the --set values") from None
    model.eval()
    named = example_inputs(config, head, batch_size, seq_len, torch.Generator().manual_seed(seed))
    wrapper = WRAPPERS[tuple(named)](model).eval()
    wrapper._example = tuple(named.values())
    return wrapper, tuple(named.values())


# Small sizes for tests and the family table (benchmarks/hf_families.py): every key a family's
# config has is set, so one table covers GPT-2's n_embd, T5's d_model and BERT's hidden_size alike.
SMALL_SIZES: dict[str, int] = {
    # depth
    "num_hidden_layers": 2, "n_layer": 2, "n_layers": 2, "num_layers": 2, "num_decoder_layers": 2,
    "encoder_layers": 2, "decoder_layers": 2, "num_encoder_layers": 2,
    # width
    "hidden_size": 64, "n_embd": 64, "d_model": 64, "dim": 64, "emb_dim": 64, "embedding_size": 32,
    "input_embedding_size": 32, "output_embedding_size": 64,
    "intermediate_size": 128, "n_inner": 128, "d_ff": 128, "d_inner": 128, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "ffn_dim": 128, "hidden_dim": 128, "moe_intermediate_size": 64,
    # attention
    "num_attention_heads": 4, "n_head": 4, "num_heads": 4, "n_heads": 4, "encoder_attention_heads": 4,
    "decoder_attention_heads": 4, "num_encoder_attention_heads": 4, "num_decoder_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "d_head": 16, "d_kv": 16, "rotary_dim": 8,
    # multi-head latent attention (DeepSeek-V3)
    "kv_lora_rank": 32, "q_lora_rank": 32, "v_head_dim": 16,  # qk_*_head_dim: head_dim is derived from them
    # recurrent and state-space layers (RWKV, RecurrentGemma, Jamba)
    "attention_hidden_size": 64, "lru_width": 64, "mamba_dt_rank": 8,
    # vocabulary, positions, images
    "vocab_size": 128, "src_vocab_size": 128, "tgt_vocab_size": 128, "max_position_embeddings": 64,
    "n_positions": 64, "image_size": 64,
    # experts: 2 of 4 routed per token, one group, the second layer already sparse
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1,
    "topk_group": 1, "first_k_dense_replace": 1,
}
# What one family needs beyond SMALL_SIZES.
FAMILY_SIZES: dict[str, dict[str, str]] = {
    "esm": {"pad_token_id": "1", "mask_token_id": "2"},  # unset by default; the embeddings compare the ids with both
    # EfficientNet scales its stages by coefficients (B7's by default); hidden_dim is the last conv's width
    "efficientnet": {"width_coefficient": "0.5", "depth_coefficient": "0.5", "hidden_dim": "640"},
    # RWKV divides its weights in place on the first eval forward (an fp16 trick): a parameter mutation
    # inside the traced forward. rescale_every=0 turns it off.
    "rwkv": {"rescale_every": "0"},
    # multi-head latent attention makes a key per query head: no grouped queries
    "deepseek_v3": {"num_key_value_heads": str(SMALL_SIZES["num_attention_heads"])},
}


def small_overrides(model_type: str) -> dict[str, str]:
    """`--set` values that shrink `hf:model_type` to a few hundred thousand weights."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    fields = config.to_dict()
    # Constructor arguments only: Swin's hidden_size and num_layers are derived from embed_dim and depths.
    # An alias (Qwen3-MoE's num_experts for num_local_experts) is set through its constructor name; an
    # unset field (None: ESM's vocab_size, Nemotron's num_key_value_heads) gets the small size too.
    params = inspect.signature(type(config).__init__).parameters

    def sized(key: str) -> bool:
        value = getattr(config, key, None)
        return key in params and (value is None or isinstance(value, int) and not isinstance(value, bool))

    small = {k: str(v) for k, v in SMALL_SIZES.items() if sized(k)}
    if "embedding_size" in small and "hidden_size" in small and isinstance(fields.get("embedding_size"), int) \
            and fields["embedding_size"] == fields.get("hidden_size"):
        small["embedding_size"] = small["hidden_size"]  # tied by default (SqueezeBERT requires it)
    if "window_size" in fields:  # windowed attention (Swin) needs the resolution its windows were sized for
        small.pop("image_size", None)
        if isinstance(fields.get("embed_dim"), int):
            small["embed_dim"] = "48"  # divisible by every stage's heads (3, 6, 12, 24)
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "cls_token_id",
                "sep_token_id", "mask_token_id"):  # keep them in the vocab
        if isinstance(fields.get(key), int) and fields[key] >= SMALL_SIZES["vocab_size"]:
            small[key] = "0"
    return {**small, **FAMILY_SIZES.get(model_type, {})}
