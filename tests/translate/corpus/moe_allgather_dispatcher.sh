#!/bin/bash
# corpus: a Mixtral-style MoE script written for PyTorch with the all-gather token dispatcher
# corpus-reported: --moe-token-dispatcher-type allgather
# corpus-replaced: --moe-token-dispatcher-type alltoall
NPUS_PER_NODE=8
MASTER_PORT=6005

MOE_ARGS="
    --num-experts 8 \
    --expert-model-parallel-size 2 \
    --moe-router-topk 2 \
    --moe-token-dispatcher-type allgather
"

torchrun --nproc_per_node $NPUS_PER_NODE --master_port $MASTER_PORT pretrain_gpt.py \
    $MOE_ARGS \
    --tensor-model-parallel-size 4 \
    --use-flash-attn \
    --bf16 \
    --distributed-backend nccl
