"""The model zoo: small models built from code, no downloads.

Each entry has a config dataclass (overridable with `--set KEY=VALUE`), a
builder and an example-input factory. The small defaults are for tests; named
large configs (`zoo:llama-7b`, `zoo:llama-70b`, `zoo:llama-405b`) are for benchmarks and are
`meta_only`: `build_zoo` builds them on the meta device, so they cost no weight
memory.

    >>> module, inputs = build_zoo("mlp", {"n_blocks": "2"}, batch_size=4, seq_len=16)
    >>> tuple(inputs[0].shape)
    (4, 64)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hetpart.errors import HetpartError
from hetpart.models import bert, glm, gpt, hgnn, llama, lstm, mlp, moe, resnet, t5, unet, vit
from hetpart.models.meta import params_on_meta


@dataclass(frozen=True)
class ZooModel:
    name: str
    domain: str
    description: str
    config_cls: type
    build: Callable[[Any], nn.Module]
    example_inputs: Callable[[Any, int, int], tuple[torch.Tensor, ...]]
    meta_only: bool = False  # too big to build with real weights: built on the meta device


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("mlp", "tabular / MLP", "residual MLP with a long skip to the head",
                 mlp.MLPConfig, mlp.build, mlp.example_inputs),
        ZooModel("glm", "tabular / GLM", "logistic regression over embedding-bag categorical + dense features",
                 glm.GLMConfig, glm.build, glm.example_inputs),
        ZooModel("resnet", "vision (CNN)", "ResNet basic blocks, BatchNorm (eval), skip connections",
                 resnet.ResNetConfig, resnet.build, resnet.example_inputs),
        ZooModel("vit", "vision (transformer)", "ViT: conv patch embedding, class token, encoder",
                 vit.ViTConfig, vit.build, vit.example_inputs),
        ZooModel("unet", "diffusion", "UNet noise predictor: timestep embedding, down/up paths, concatenated skips",
                 unet.UNetConfig, unet.build, unet.example_inputs),
        ZooModel("lstm", "language (recurrent)", "stacked LSTM language model, time steps unrolled",
                 lstm.LSTMConfig, lstm.build, lstm.example_inputs),
        ZooModel("gpt-small", "language (decoder)", "GPT-2-style decoder, tied LM head",
                 gpt.GPTConfig, gpt.build, gpt.example_inputs),
        ZooModel("llama", "language (decoder)", "Llama-style: RoPE, RMSNorm, SwiGLU, grouped-query attention",
                 llama.LlamaConfig, llama.build, llama.example_inputs),
        ZooModel("moe", "language (MoE)", "decoder with top-2-routed expert MLPs (dense dispatch)",
                 moe.MoEConfig, moe.build, moe.example_inputs),
        ZooModel("bert", "language (encoder)", "BERT-style encoder, padding mask, tied masked-LM head",
                 bert.BertConfig, bert.build, bert.example_inputs),
        ZooModel("t5", "language (seq2seq)", "T5-style: relative position bias, cross-attention",
                 t5.T5Config, t5.build, t5.example_inputs),
        ZooModel("hgnn", "graphs", "heterogeneous R-GCN: relation-typed index_add message passing, fixed graph",
                 hgnn.HGNNConfig, hgnn.build, hgnn.example_inputs),
        ZooModel("llama-7b", "language (decoder)", "zoo:llama at Llama-2-7B dimensions (meta only)",
                 llama.Llama7BConfig, llama.build, llama.example_inputs, meta_only=True),
        ZooModel("llama-70b", "language (decoder)", "zoo:llama at Llama-2-70B dimensions, GQA (meta only)",
                 llama.Llama70BConfig, llama.build, llama.example_inputs, meta_only=True),
        ZooModel("llama-405b", "language (decoder)", "zoo:llama at Llama-3.1-405B dimensions, GQA (meta only)",
                 llama.Llama405BConfig, llama.build, llama.example_inputs, meta_only=True),
    ]
}


def convert_override(key: str, raw: str, current: Any) -> Any:
    """The `--set KEY=VALUE` string as the type of the field's current value.

    An unset optional field (None) takes the most specific literal that parses.
    """
    if current is None:
        for kind in (int, float):
            try:
                return kind(raw)
            except ValueError:
                pass
        return {"true": True, "false": False, "none": None}.get(raw.lower(), raw)
    kind = type(current)
    try:
        if kind is bool:
            if raw.lower() not in {"true", "false", "1", "0"}:
                raise ValueError
            return raw.lower() in {"true", "1"}
        if kind in (list, tuple, dict):
            raise ValueError
        value = kind(raw)
        if kind is float and not math.isfinite(value):
            raise ValueError
        return value
    except ValueError:
        raise HetpartError(f"--set {key}={raw}: expected a {kind.__name__} (current value {current!r})") from None


def apply_overrides(config: Any, overrides: dict[str, str], what: str) -> Any:
    """A copy of dataclass `config` with `--set` values converted to each field's type."""
    names = [f.name for f in dataclasses.fields(config)]
    changes = {}
    for key, raw in overrides.items():
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise HetpartError(f"--set {key}: {what} has no field '{key}'; {hint}fields: {', '.join(names)}")
        current = getattr(config, key)
        changes[key] = convert_override(key, raw, current)
        if (isinstance(current, (int, float)) and not isinstance(current, bool) and current >= 0
                and changes[key] < 0):
            raise HetpartError(f"--set {key}={raw}: {what}'s {key} is a size or a count, it must be >= 0")
    return dataclasses.replace(config, **changes)


def zoo_model(name: str) -> ZooModel:
    if name not in ZOO:
        close = difflib.get_close_matches(name, list(ZOO), n=3)
        hint = f" did you mean {', '.join('zoo:' + c for c in close)}?" if close else ""
        raise HetpartError(f"unknown model 'zoo:{name}' (known: {', '.join(sorted(ZOO))}).{hint} See `hetpart models`")
    return ZOO[name]


def build_zoo(name: str, overrides: dict[str, str], batch_size: int, seq_len: int, seed: int = 0
              ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build zoo model `name` with random weights from `seed`, and example inputs.

    A `meta_only` model's weights are meta tensors (shapes and dtypes, no data);
    its example inputs are real, small tensors.
    """
    entry = zoo_model(name)
    cfg = apply_overrides(entry.config_cls(), overrides, f"zoo:{name}")
    torch.manual_seed(seed)
    try:
        if entry.meta_only:
            with params_on_meta():
                module = entry.build(cfg).eval()
        else:
            module = entry.build(cfg).eval()
        inputs = entry.example_inputs(cfg, batch_size, seq_len)
    except (RuntimeError, ValueError, TypeError, OverflowError, ZeroDivisionError, AssertionError) as err:
        # The zoo's own code is tested at its defaults: a failure here comes from the --set values.
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        sets = " ".join(f"--set {k}={v}" for k, v in overrides.items())
        raise HetpartError(f"zoo:{name}{' with ' + sets if sets else ''}: building the model failed: "
                           f"{type(err).__name__}: {first[:200]}; check the --set values, --batch-size and --seq-len"
                           ) from None
    return module, inputs
