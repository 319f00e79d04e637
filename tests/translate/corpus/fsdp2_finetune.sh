#!/bin/bash
# corpus: a PyTorch FSDP2 fine-tune (MSAdapter has no DTensor/FSDP2, so the MindSpore backend cannot shard with it)
# corpus-reported: --use-torch-fsdp2
# corpus-refused: --use-torch-fsdp2
# corpus-unknown: --ckpt-format torch_dist
NPUS_PER_NODE=16
MASTER_ADDR=localhost
MASTER_PORT=6000

GPT_ARGS="
    --use-mcore-models \
    --micro-batch-size 1 \
    --bf16 \
    --use-flash-attn \
    --use-torch-fsdp2 \
    --fsdp2-config-path ./examples/qwen2.5vl/fsdp2_config.yaml \
    --use-cpu-initialization \
    --ckpt-format torch_dist
"

torchrun --nproc_per_node $NPUS_PER_NODE --master_addr $MASTER_ADDR --master_port $MASTER_PORT pretrain_vlm.py \
    $GPT_ARGS \
    --distributed-backend nccl
