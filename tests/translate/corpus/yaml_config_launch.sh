#!/bin/bash
# corpus: a YAML-config launch (the model and parallel layout live in a config file; a few switches follow it)
# corpus-reported: none
NPUS_PER_NODE=8
MASTER_PORT=29500
CONFIG=examples/qwen3vl/finetune_qwen3vl_8b.yaml

torchrun --nproc_per_node=$NPUS_PER_NODE --nnodes=1 --master_port=$MASTER_PORT \
    pretrain_transformers.py "$CONFIG" \
    --use-flash-attn \
    --use-distributed-optimizer \
    --bf16 \
    --distributed-backend nccl
