"""megatron-core as mmrun's PyTorch engine for tensor, pipeline, context and data parallelism (torch only).

The training loop reaches it through mmrun.engines (the registry); megatron-core itself is imported for the
device by backend/torch/megatron_core/runtime.py (with cpu_shims.py on CPU).

- gpt.py              GPTModel from Megatron's arguments, starting from mmrun's GPT weights
- vlm.py              Qwen2-VL / Qwen2.5-VL per pipeline stage (ViT + merger + mrope GPTModel), MindSpeed-MM's names
- context_parallel.py all-gather context-parallel attention for the local layer spec
- engine.py           the engine: parallel state, DDP, optimizer, pipeline schedules, checkpoint shards
- optimizer_state.py  the optimizer's state per parameter, for checkpoints (distributed optimizer included)
"""
