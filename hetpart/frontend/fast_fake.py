"""Shape-only kernels for the two ops that dominate tracing a transformer.

NOTE [fast fake kernels]: non-strict torch.export traces with a symbolic batch and
computes every op's output on fake tensors. `aten.linear` and
`aten.scaled_dot_product_attention` are composite ops that export keeps whole in the
graph, but their outputs are computed by running their composite kernels below the
tracer: `linear` through the Python `matmul` decomposition (folding and reshapes on
symbolic sizes), SDPA on meta through its math path: a large share of exporting a
large transformer on meta (docs/benchmarks.md, "Measurements moved out of NOTEs"). Their
outputs are plain: linear gives
`x.shape[:-1] + [out]`, SDPA on meta `q.shape[:-1] + [v.shape[-1]]`, contiguous, in the
input's dtype and device. While `export_model` traces, `fast_fake_kernels` registers
Python kernels for the two ops' CompositeImplicitAutograd key (the Python dispatcher,
which export turns on, prefers them) that build that output directly when every tensor
is fake; any other case (real tensors, mixed dtypes, unusual ranks, sizes not known to
match, SDPA on a real device, where torch picks a fused kernel with its own layout) runs
torch's own kernel, which also raises torch's own errors. The graph is unchanged:
tests/frontend/test_fast_fake.py compares every node's fake value (shape, stride, dtype)
with and without them. The kernels are removed on exit; where torch lacks the API, tracing
is just slower.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

aten = torch.ops.aten


def _is_static_equal(a: object, b: object) -> bool:
    """a == b known without adding a guard (both plain ints, or the same symbolic expression)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return False


def _all_fake(*tensors) -> bool:
    """Every tensor is fake and none needs a gradient (a kernel here records no autograd graph)."""
    from torch._subclasses.fake_tensor import FakeTensor

    grad = torch.is_grad_enabled()
    return all(t is None or (isinstance(t, FakeTensor) and not (grad and t.requires_grad)) for t in tensors)


def _torch_kernel(op, *args, **kwargs):
    """torch's own composite kernel of `op` (what runs when ours does not apply)."""
    return op._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *args, **kwargs)


def _linear(x, weight, bias=None):
    if (_all_fake(x, weight, bias) and x.dim() >= 2 and weight.dim() == 2 and x.dtype == weight.dtype
            and x.device == weight.device and x.dtype.is_floating_point
            and _is_static_equal(x.shape[-1], weight.shape[1])
            and (bias is None or (bias.dim() == 1 and bias.dtype == x.dtype and bias.device == x.device
                                  and _is_static_equal(bias.shape[0], weight.shape[0])))):
        return torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device)
    return _torch_kernel(aten.linear.default, x, weight, bias)


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    q, k, v = query, key, value
    # Only on meta (a model traced without its weights): torch has no fused kernel for meta and runs
    # its math path, which ends in a matmul, so the output is contiguous. On a real device torch
    # picks a kernel (CPU's flash kernel lays its output out like the query) by checks that are not
    # worth repeating here: the small models traced with their weights take torch's own path.
    if (_all_fake(q, k, v, attn_mask) and q.device.type == "meta" and q.dim() == k.dim() == v.dim() == 4
            and q.dtype == k.dtype == v.dtype and q.dtype.is_floating_point and q.device == k.device == v.device
            and all(_is_static_equal(q.shape[i], k.shape[i]) and _is_static_equal(k.shape[i], v.shape[i])
                    for i in (0, 1))
            and _is_static_equal(q.shape[-1], k.shape[-1]) and _is_static_equal(k.shape[2], v.shape[2])
            and (attn_mask is None or (not is_causal and attn_mask.dim() <= 4 and attn_mask.device == q.device))):
        return torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    return _torch_kernel(aten.scaled_dot_product_attention.default, query, key, value, attn_mask, dropout_p,
                         is_causal, scale=scale, enable_gqa=enable_gqa)


_KERNELS = {aten.linear.default: _linear, aten.scaled_dot_product_attention.default: _sdpa}
_KEYS = (torch._C.DispatchKey.CompositeImplicitAutograd,)


@contextlib.contextmanager
def fast_fake_kernels() -> Iterator[None]:
    """NOTE [fast fake kernels]: shape-only linear and SDPA kernels while tracing."""
    added = []
    try:
        for op, kernel in _KERNELS.items():
            for key in _KEYS:
                if key not in op.py_kernels:  # never replace a kernel someone else registered
                    op.py_impl(key)(kernel)
                    added.append((op, key))
    except (AttributeError, AssertionError, RuntimeError):  # another torch: trace as usual
        pass
    for op, _ in added:
        op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key in added:
            op.py_kernels.pop(key, None)
            op._dispatch_cache.clear()
