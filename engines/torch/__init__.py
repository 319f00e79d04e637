"""PyTorch's engines: megatron-core (tensor, pipeline, context parallelism, the distributed optimizer), torch's
FSDP2 and DDP, and the transformers models they train. This folder and backend/torch/ are the only ones that
import torch; nothing here imports MindSpore (tests/test_layers.py)."""
