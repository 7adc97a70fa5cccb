"""elasticd: a node supervisor and control plane for elastic PyTorch training."""

__version__ = "0.1.0"
