"""megatron-core as mmrun's PyTorch engine for tensor, pipeline, context and data parallelism (torch only).

Not part of the portable backend face: MindSpore has no megatron-core, so this package has no twin in
`mmrun.backend.mindspore` (tests/backend_api/test_backend_face.py compares only the modules outside
each backend's FRAMEWORK_ONLY set). The training loop reaches it through training/engines/.

- runtime.py          megatron-core imported for this device (shims on CPU only, transfer_to_npu on NPU)
- cpu_shims.py        every CPU shim megatron-core needs, each with its reason
- gpt.py              GPTModel from Megatron's arguments, starting from mmrun's GPT weights
- context_parallel.py all-gather context-parallel attention for the local layer spec
- engine.py           the engine: parallel state, DDP, optimizer, pipeline schedules, checkpoint shards
- optimizer_state.py  the optimizer's state per parameter, for checkpoints (distributed optimizer included)
"""
