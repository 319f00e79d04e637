"""megatron-core's GPT and MindSpeed-MM's Qwen2-VL rebuilt on MindSpore, and the engine the training loop drives
(MindSpore only).

The framework primitives it uses (groups, mappings, layers, cross_entropy, p2p, the pipeline train step
ParallelTrainStep) are model-free and live in backend/mindspore/parallel/.

- gpt.py     GPTModel with megatron-core's parameter names and shards; build_engine(args) puts it together
- vlm.py     Qwen2-VL / Qwen2.5-VL per (TP, PP) rank with MindSpeed-MM's names (models/vlm/mm_layout.py)
- qwen3_vlm.py  Qwen3-VL's stage on vlm.py's layers
- vlm_engine.py  the stage of each family, the train step and the engine for models/pretrain_vlm.py
- rank_state.py  one rank's parameters to numpy and back (checkpoint shards), for both models
- engine.py  the mindspore-parallel engine of mmrun.engines (parallel state, steps, checkpoint shards)
- optimizer.py  each rank's AdamW and train step (with --use-distributed-optimizer: sharded over the data-parallel group)
create() below picks the GPT's or the VLM's by the entry's model source (here, above both, so no module imports
the one that builds on it).
"""
from __future__ import annotations

from typing import Any, Callable


def create(args: Any, framework: str, log: Callable[[str], None]) -> Any:
    """The engine for this run's model: the GPT's, or the VLM's when the entry's model comes from MindSpeed-MM's
    model.json (models/pretrain_vlm.py: --mm-model)."""
    if getattr(args, "model_source", None) == "--mm-model":
        from mmrun.engines.mindspore.parallel.vlm_engine import MindSporeVLMEngine

        return MindSporeVLMEngine(args, framework, log)
    from mmrun.engines.mindspore.parallel.engine import MindSporeParallelEngine

    return MindSporeParallelEngine(args, framework, log)

