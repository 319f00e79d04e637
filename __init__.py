"""mmrun: one command runs a Megatron-style job on PyTorch or MindSpore."""

__version__ = "0.1.0"
