"""Readable, standalone `stage.py` source for one stage (imports only torch and safetensors).

The forward body is FX's own Python codegen of the stage graph; we add a
header, the weight table and an `__init__` that loads the weights beside the file.
"""

from __future__ import annotations

import math
import textwrap

import torch

from hetpart.codegen.split import StageGraph, shared_weights_file
from hetpart.codegen.tp import TP_FUNCTIONS, TP_SOURCE

# Names FX's codegen may reference, and how a standalone file defines them.
_PRELUDE = {
    "torch": None,
    "inf": "inf = math.inf",
    "nan": "nan = math.nan",
    "NoneType": "NoneType = type(None)",
    "device": "device = torch.device",
    "fx_pytree": "import torch.fx._pytree as fx_pytree",
    "pytree": "import torch.utils._pytree as pytree",
}


def _global_line(name: str, value: object) -> str:
    if name in _PRELUDE:
        return _PRELUDE[name] or ""
    if isinstance(value, torch.dtype):
        return f"{name} = {value}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{name} = float({str(value)!r})"
    raise ValueError(f"stage code references global '{name}' = {value!r}, which stage.py cannot define")


def stage_source(stage: StageGraph, header: str, param_attrs: set[str]) -> str:
    """The stage as a Python module defining `Stage(nn.Module)`; `header` becomes its docstring."""
    code = stage.gm.graph.python_code(root_module="self")
    body = code.src.strip("\n")
    used = [n for n in sorted(code.globals) if n in body.replace("def forward", "")]
    lines = [_global_line(n, code.globals[n]) for n in used if n not in TP_FUNCTIONS]
    prelude = "".join(f"{line}\n" for line in lines if line)
    prelude += TP_SOURCE if set(used) & set(TP_FUNCTIONS) else ""  # NOTE [tensor-parallel stages]
    weights = "\n".join(
        f"    {attr!r}: ({fqn!r}, {'True' if attr in param_attrs else 'False'}),"
        for attr, fqn in stage.weights.items()
    )
    shared = "".join(f"    {fqn!r}: {shared_weights_file(k)!r},\n" for fqn, k in sorted(stage.stored_in.items()))
    return f'''"""{header}"""

import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

{prelude}
# attribute -> (key in weights.safetensors, is a trainable parameter)
WEIGHTS = {{
{weights}
}}
# key -> the weights.safetensors of an earlier rank that holds its one copy (relative to this file's folder)
SHARED = {{
{shared}}}
INPUTS = {stage.inputs!r}
OUTPUTS = {stage.outputs!r}


class Stage(torch.nn.Module):
    def __init__(self, weights_path: str | Path | None = None) -> None:
        super().__init__()
        tensors = load_file(str(weights_path or Path(__file__).with_name("weights.safetensors"))) if WEIGHTS else {{}}
        for key, file in SHARED.items():  # only this tensor of that file
            with safe_open(str(Path(__file__).parent / file), "pt") as f:
                tensors[key] = f.get_tensor(key)
        for attr, (key, is_param) in WEIGHTS.items():
            if is_param:
                self.register_parameter(attr, torch.nn.Parameter(tensors[key]))
            else:
                self.register_buffer(attr, tensors[key])

{textwrap.indent(body, "    ")}
'''
