"""Building models without their weights' memory (NOTE [meta build])."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


# NOTE [meta build]
# A 70B model cannot be built on this machine, and need not be: partitioning needs
# shapes and dtypes, not values. `params_on_meta` puts every parameter on the meta
# device as it is registered (the CPU tensor a constructor allocates is never
# initialised, so its pages are never touched, and it is dropped at once), while
# buffers stay real: they are small, and non-persistent ones (RoPE's inv_freq,
# position ids) are in no checkpoint, so their values must come from here.
# `accelerate.init_empty_weights(include_buffers=False)` does the same.
@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Build modules with parameters on the meta device and buffers as usual (NOTE [meta build])."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            p = module._parameters[name]
            extra = {} if type(p) is nn.Parameter else dict(p.__dict__)
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad, **extra)

    nn.Module.register_parameter = register_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register
