"""megatron-core's GPT and MindSpeed-MM's Qwen2-VL rebuilt on MindSpore, and the engine the training loop drives
(MindSpore only).

The framework primitives it uses (groups, mappings, layers, cross_entropy, p2p, the pipeline train step
ParallelTrainStep) are model-free and live in backend/mindspore/parallel/.

- gpt.py     GPTModel with megatron-core's parameter names and shards; build_engine(args) puts it together
- vlm.py     Qwen2-VL / Qwen2.5-VL per (TP, PP) rank with MindSpeed-MM's names (models/qwen2_vl/mm_layout.py) and
             its engine, for models/pretrain_vlm.py
- rank_state.py  one rank's parameters to numpy and back (checkpoint shards), for both models
- engine.py  the mindspore-parallel engine of mmrun.engines (parallel state, steps, checkpoint shards); create()
             picks the GPT's or the VLM's by the entry's model source
"""
