"""Model specs -> nn.Module and example inputs -> FX graph (torch.export)."""

from hetpart.frontend.export import export_model
from hetpart.frontend.load import (
    ModelSpec, SequenceAxes, check_example_batch, checkpoint_names, load_for_tracing, load_model, model_file_sha256,
    sequence_axes,
)

__all__ = ["ModelSpec", "SequenceAxes", "check_example_batch", "checkpoint_names", "export_model", "load_for_tracing",
           "load_model", "model_file_sha256", "sequence_axes"]
