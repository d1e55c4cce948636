"""export_model: errors name the model's own source line; baked devices are dropped."""

import pytest
import torch
from torch import nn

from hetpart.errors import HetpartError
from hetpart.frontend import export_model


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # the line the error must name
            return x
        return -x


class BakedDevice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.arange(4.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(device=x.device, dtype=torch.float32)


def test_untraceable_model_error_names_its_source_line():
    with pytest.raises(HetpartError) as err:
        export_model(DataDependent(), (torch.randn(4, 3),))
    message = str(err.value)
    assert f"{__file__}:" in message and "in forward (`if x.sum() > 0:" in message
    assert "what to try" in message


def test_devices_baked_into_conversions_are_dropped():
    gm = export_model(BakedDevice(), (torch.randn(2, 4),))
    for node in gm.graph.nodes:
        assert "device" not in node.kwargs, node.format_node()
        assert not any(isinstance(a, torch.device) for a in node.args), node.format_node()
    x = torch.randn(3, 4)
    torch.testing.assert_close(gm(x), BakedDevice()(x))
