"""The model zoo: small models built from code, no downloads.

Each entry has a config dataclass (overridable with `--set KEY=VALUE`), a
builder and an example-input factory.

    >>> module, inputs = build_zoo("mlp", {"n_blocks": "2"}, batch_size=4, seq_len=16)
    >>> tuple(inputs[0].shape)
    (4, 64)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hetpart.errors import HetpartError
from hetpart.models import gpt, mlp


@dataclass(frozen=True)
class ZooModel:
    name: str
    domain: str
    description: str
    config_cls: type
    build: Callable[[Any], nn.Module]
    example_inputs: Callable[[Any, int, int], tuple[torch.Tensor, ...]]


ZOO: dict[str, ZooModel] = {
    m.name: m
    for m in [
        ZooModel("mlp", "tabular / MLP", "residual MLP with a long skip to the head",
                 mlp.MLPConfig, mlp.build, mlp.example_inputs),
        ZooModel("gpt-small", "language (decoder)", "GPT-2-style decoder, tied LM head",
                 gpt.GPTConfig, gpt.build, gpt.example_inputs),
    ]
}


def _convert(key: str, raw: str, current: Any) -> Any:
    kind = type(current)
    try:
        if kind is bool:
            if raw.lower() not in {"true", "false", "1", "0"}:
                raise ValueError
            return raw.lower() in {"true", "1"}
        return kind(raw)
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
        changes[key] = _convert(key, raw, getattr(config, key))
    return dataclasses.replace(config, **changes)


def zoo_model(name: str) -> ZooModel:
    if name not in ZOO:
        close = difflib.get_close_matches(name, list(ZOO), n=3)
        hint = f" did you mean {', '.join('zoo:' + c for c in close)}?" if close else ""
        raise HetpartError(f"unknown model 'zoo:{name}' (known: {', '.join(sorted(ZOO))}).{hint} See `hetpart models`")
    return ZOO[name]


def build_zoo(name: str, overrides: dict[str, str], batch_size: int, seq_len: int, seed: int = 0
              ) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build zoo model `name` with random weights from `seed`, and example inputs."""
    entry = zoo_model(name)
    cfg = apply_overrides(entry.config_cls(), overrides, f"zoo:{name}")
    torch.manual_seed(seed)
    module = entry.build(cfg).eval()
    inputs = entry.example_inputs(cfg, batch_size, seq_len)
    return module, inputs
