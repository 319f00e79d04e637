#!/bin/bash
# corpus: MoE pretraining on 4 nodes, node rank from the command line (EP 8, VPP, CP 2 ring attention, grouped GEMM)
# corpus-reported: none
# corpus-unknown: --recompute-activation-function
export HCCL_CONNECT_TIMEOUT=1800
export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
MASTER_ADDR=${MASTER_ADDR:-192.168.0.10}
MASTER_PORT=6000
NNODES=4
NODE_RANK=$1
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))

TP=2
PP=4
EP=8
CP=2
VPP_LAYERS=2

DISTRIBUTED_ARGS="--nproc_per_node $GPUS_PER_NODE --nnodes $NNODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT"

MOE_ARGS="
    --num-experts 64 \
    --expert-model-parallel-size ${EP} \
    --moe-router-topk 6 \
    --moe-aux-loss-coeff 0.001 \
    --moe-token-dispatcher-type alltoall \
    --moe-grouped-gemm \
    --moe-permutation-async-comm
"

MODEL_PARALLEL_ARGS="
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --num-layers-per-virtual-pipeline-stage ${VPP_LAYERS} \
    --context-parallel-size ${CP} \
    --context-parallel-algo megatron_cp_algo \
    --cp-comm-type p2p \
    --sequence-parallel
"

GPT_ARGS="
    --use-mcore-models \
    --num-layers 32 \
    --hidden-size 4096 \
    --num-attention-heads 32 \
    --seq-length 16384 \
    --max-position-embeddings 16384 \
    --micro-batch-size 1 \
    --global-batch-size 512 \
    --use-flash-attn \
    --use-fused-rmsnorm \
    --use-fused-swiglu \
    --use-fused-rotary-pos-emb \
    --recompute-activation-function \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --bf16
"

torchrun $DISTRIBUTED_ARGS pretrain_gpt.py \
    $MOE_ARGS \
    $MODEL_PARALLEL_ARGS \
    $GPT_ARGS \
    --data-path ./dataset/pile_text_document \
    --split 100,0,0 \
    --log-interval 1 \
    --distributed-backend nccl \
    --save ./ckpt/moe
