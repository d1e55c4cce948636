"""Model specs -> nn.Module and example inputs -> FX graph (torch.export)."""

from hetpart.frontend.export import export_model
from hetpart.frontend.load import ModelSpec, load_model

__all__ = ["ModelSpec", "export_model", "load_model"]
