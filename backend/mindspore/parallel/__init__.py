"""Megatron's tensor and pipeline parallelism built from MindSpore's collectives, for every device.

MindSpore's own parallel modes (semi-auto / auto parallel, pipeline stages) are the engine on Ascend; they do
not run on CPU ("RuntimeError: Invalid backend: CPU", MindSpore 2.10). This package follows megatron-core's
design instead, on any device MindSpore runs on:

    groups          initialize_model_parallel(tp, pp): Megatron's rank order (tp-cp-ep-dp-pp) and groups
    mappings        the f/g regions (copy/reduce/scatter/gather, tensor and sequence) as cells with a bprop
    layers          ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    cross_entropy   VocabParallelCrossEntropy
    p2p             send/receive between pipeline stages
    engine          ParallelTrainStep: the 1F1B schedule, megatron-core's gradient finalization, the norm over
                    model-parallel ranks, clipping and AdamW

The model that uses them is mmrun.engines.mindspore.parallel.gpt (megatron-core's GPTModel, its parameter names and
shards). MindSpore only: not part of the portable backend face (PyTorch's engine is megatron-core itself).
"""
