"""MindSpore's engines: Megatron's design (tensor, pipeline, sequence parallelism) built on the framework
primitives of backend/mindspore/parallel/. This folder and backend/mindspore/ are the only ones that import
MindSpore; nothing here imports torch (tests/test_layers.py)."""
