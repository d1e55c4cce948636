"""NOTE [fast fake kernels]: tracing with the shape-only linear/SDPA kernels gives the same graph."""

from __future__ import annotations

import os

import pytest
import torch
from torch.export import Dim

import hetpart.frontend.fast_fake as fast_fake
from hetpart.frontend import ModelSpec, load_for_tracing

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CASES = [
    # (model, overrides, meta): CPU's flash SDPA with a mask and GQA (torch's path), SDPA on meta (ours)
    ("hf:llama", {"num_hidden_layers": "1", "hidden_size": "64", "intermediate_size": "128",
                  "num_attention_heads": "4", "num_key_value_heads": "2", "vocab_size": "100"}, False),
    ("hf:llama", {"num_hidden_layers": "1", "hidden_size": "64", "intermediate_size": "128",
                  "num_attention_heads": "4", "num_key_value_heads": "4", "vocab_size": "100"}, True),
    ("zoo:gpt-small", {}, False),
]


def _export(module, inputs):
    dynamic = tuple({0: Dim.DYNAMIC} for _ in inputs)
    with torch.no_grad():
        return torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)


def _signature(ep) -> list[tuple]:
    """Every node's op, target and fake value (shape, stride, dtype, device)."""
    out = []
    for node in ep.graph.nodes:
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        out.append((node.op, str(node.target), tuple(
            (str(v.shape), str(v.stride()), v.dtype, v.device.type) for v in vals if isinstance(v, torch.Tensor))))
    return out


@pytest.mark.parametrize(("model", "overrides", "meta"), CASES, ids=lambda c: str(c)[:30])
def test_same_graph_with_and_without_fast_kernels(model, overrides, meta, monkeypatch):
    module, inputs, _ = load_for_tracing(ModelSpec(model, overrides, batch_size=4, seq_len=16), meta=meta)
    used = []
    kernels = {op: (lambda k: lambda *a, **kw: used.append(k.__name__) or k(*a, **kw))(k)
               for op, k in fast_fake._KERNELS.items()}
    monkeypatch.setattr(fast_fake, "_KERNELS", kernels)
    plain = _signature(_export(module, inputs))
    with fast_fake.fast_fake_kernels():
        fast = _signature(_export(module, inputs))
    assert fast == plain
    assert "_linear" in used and (not meta or "_sdpa" in used)  # ours ran: else torch would be compared with itself
    for op in fast_fake._KERNELS:
        assert torch._C.DispatchKey.CompositeImplicitAutograd not in op.py_kernels  # removed on exit


class _Mixed(torch.nn.Module):
    """A float64 linear, then a linear on a 1-D input (left to torch's kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.wide, self.one = torch.nn.Linear(8, 4).double(), torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.wide(x.double()).float()
        return self.one(y[0])


def test_cases_the_kernels_leave_to_torch():
    """A 1-D input goes through torch's own kernel: the same graph, and it runs."""
    module, x = _Mixed(), torch.randn(3, 8)
    plain = _export(module, (x,))
    with fast_fake.fast_fake_kernels():
        fast = _export(module, (x,))
    assert _signature(fast) == _signature(plain)
    assert fast.module()(torch.randn(5, 8)).shape == (2,)
