#!/bin/bash
GPT_ARGS="
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 8 \
    --use-flash-attn \
    --use-fused-rmsnorm \
    --use-distributed-optimizer \
    --bf16
"
OUTPUT_ARGS="--log-interval 1 --log-tps"
torchrun --nproc_per_node 8 pretrain_vlm.py $GPT_ARGS $OUTPUT_ARGS --distributed-backend nccl
