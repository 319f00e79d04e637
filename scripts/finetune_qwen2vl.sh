#!/bin/bash
# Qwen2-VL fine-tuning, the shape of MindSpeed-MM's examples/qwen2vl/finetune_qwen2vl_2b.sh, sized for a CPU
# and fully offline: a tiny Qwen2-VL (scripts/qwen2vl/model_tiny.json, MindSpeed-MM's model.json keys) learns
# to caption synthetic pictures ("two red circles.") drawn on the first run into $OUT_DIR (mllm_format JSON +
# PNGs, a tokenizer.json and a preprocessor_config.json, and MindSpeed-MM's data.json pointing at them).
# The launcher line is torchrun's, with `mmrun` in its place: AI_FRAMEWORK picks PyTorch (torchrun) or
# MindSpore (msrun); the same weights, batches and losses on both.
#
#   bash scripts/finetune_qwen2vl.sh                          # PyTorch, 2 processes (data parallel)
#   AI_FRAMEWORK=mindspore bash scripts/finetune_qwen2vl.sh   # the same job on MindSpore
#   NPUS_PER_NODE=1 TRAIN_ITERS=5 OUT_DIR=/tmp/vlm bash scripts/finetune_qwen2vl.sh
#   TP=2 bash scripts/finetune_qwen2vl.sh                     # tensor parallel (PyTorch: megatron-core)
#   NPUS_PER_NODE=4 TP=2 PP=2 MM_MODEL=scripts/qwen2vl/model_tiny_pp2.json bash scripts/finetune_qwen2vl.sh
#
# To fine-tune a real Qwen2-VL instead: MM_MODEL=examples/qwen2vl/model_2b.json, MM_DATA=your data.json
# (model_name_or_path = the Hugging Face directory), LOAD_PATH=that Hugging Face directory (read as it is
# downloaded; no conversion step), and sizes and iterations as MindSpeed-MM's script has them.
# Left as in MindSpeed-MM's script on purpose, to show what mmrun does with them on a CPU: --use-mcore-models and
# --use-distributed-optimizer (PyTorch: the model trains on megatron-core, docs/multimodal-parallel.md; MindSpore:
# on mmrun's data-parallel engine, --use-mcore-models off with a reason, the optimizer state sharded over the
# ranks; PyTorch without megatron-core installed, unsplit: both off, with one line saying so), --swiglu, --normalization (model.json wins),
# --ckpt-format torch, --distributed-backend nccl (replaced, with a notice). Dropped: --use-flash-attn,
# --use-fused-rmsnorm, --use-fused-swiglu: kernels a CPU does not have, which the feature gate refuses there
# (add them back with --on-unsupported warn to see the notices; on an NPU or GPU they apply).
# --load is --save here (a second run resumes); MindSpeed-MM's script adds --no-load-optim --no-load-rng
# because its LOAD_PATH holds converted weights only: add them when LOAD_PATH is a Hugging Face directory.
set -euo pipefail

AI_FRAMEWORK=${AI_FRAMEWORK:-pytorch}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

NPUS_PER_NODE=${NPUS_PER_NODE:-2}  # processes on this machine (CPU: one per core)
MASTER_ADDR=localhost
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=1
NODE_RANK=0
WORLD_SIZE=$((NPUS_PER_NODE * NNODES))

OUT_DIR=${OUT_DIR:-./out/finetune_qwen2vl_$AI_FRAMEWORK}
TRAIN_ITERS=${TRAIN_ITERS:-20}
MM_MODEL=${MM_MODEL:-$ROOT/scripts/qwen2vl/model_tiny.json}
MM_DATA=${MM_DATA:-$OUT_DIR/demo/data.json}
LOAD_PATH=${LOAD_PATH:-$OUT_DIR/ckpt}
SAVE_PATH=${SAVE_PATH:-$OUT_DIR/ckpt}

if [ "$MM_DATA" = "$OUT_DIR/demo/data.json" ] && [ ! -f "$MM_DATA" ]; then
    python -m mmrun.data.multimodal.demo "$OUT_DIR/demo"
fi

TP=${TP:-1}
PP=${PP:-1}  # PP > 1 needs model.json's pipeline_num_layers split the same way (scripts/qwen2vl/model_tiny_pp2.json)
CP=1
MBS=2
GRAD_ACC_STEP=2
DP=$((WORLD_SIZE / TP / PP / CP))
GBS=$((MBS * GRAD_ACC_STEP * DP))

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

# Model structure comes from $MM_MODEL (MindSpeed-MM's rule); these are the training settings.
GPT_ARGS="
    --use-mcore-models \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --tokenizer-type NullTokenizer \
    --vocab-size 512 \
    --seq-length 128 \
    --make-vocab-size-divisible-by 1 \
    --normalization RMSNorm \
    --swiglu \
    --lr 2.0e-3 \
    --lr-decay-style cosine \
    --weight-decay 0 \
    --train-iters ${TRAIN_ITERS} \
    --lr-warmup-fraction 0.1 \
    --clip-grad 1.0 \
    --adam-beta1 0.9 \
    --adam-beta2 0.999 \
    --seed 42 \
    --load ${LOAD_PATH} \
    --use-distributed-optimizer \
    --variable-seq-lengths
"

MM_ARGS="
    --mm-data ${MM_DATA} \
    --mm-model ${MM_MODEL}
"

OUTPUT_ARGS="
    --log-interval ${LOG_INTERVAL:-5} \
    --save-interval 10000 \
    --eval-interval 10000 \
    --eval-iters 0 \
    --save ${SAVE_PATH} \
    --ckpt-format torch
"

# shellcheck disable=SC2086  # the *_ARGS strings are word-split on purpose, as in MindSpeed-MM's script
mmrun --ai-framework "$AI_FRAMEWORK" $DISTRIBUTED_ARGS "$ROOT/models/pretrain_vlm.py" \
    $GPT_ARGS \
    $MM_ARGS \
    $OUTPUT_ARGS \
    --distributed-backend nccl
