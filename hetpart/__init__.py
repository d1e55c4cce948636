"""hetpart: partition a PyTorch model across a heterogeneous cluster, ahead of time."""

__version__ = "0.1.0"
