"""megatron-core's GPT rebuilt on MindSpore, and the engine the training loop drives (MindSpore only).

The framework primitives it uses (groups, mappings, layers, cross_entropy, p2p, the pipeline train step
ParallelTrainStep) are model-free and live in backend/mindspore/parallel/.

- gpt.py     GPTModel with megatron-core's parameter names and shards; build_engine(args) puts it together
- engine.py  the mindspore-parallel engine of mmrun.engines (parallel state, steps, checkpoint shards)
"""
