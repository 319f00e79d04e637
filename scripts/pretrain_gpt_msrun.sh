#!/bin/bash
# mmrun translate: mmrun -> msrun (--device cpu); undo: mmrun translate --to pytorch
# mmrun translate undo: [[96,1,["mmrun --ai-framework \"$AI_FRAMEWORK\" $DISTRIBUTED_ARGS \"$ROOT/models/pretrain_gpt.py\" \\\n"]]]
# Megatron-LM GPT pretraining, the shape of the Ascend migration guide's pretrain_single.sh, sized for a
# CPU: a tiny GPT trained for a few iterations on the demo corpus shipped in data/corpus/. The launcher
# line is torchrun's, with `mmrun` in its place: AI_FRAMEWORK picks PyTorch (torchrun) or MindSpore (msrun).
# Its msrun twin, scripts/pretrain_gpt_msrun.sh, is generated from this file by `mmrun translate`.
#
#   bash scripts/pretrain_gpt.sh                         # PyTorch, 2 processes (data parallel)
#   AI_FRAMEWORK=mindspore bash scripts/pretrain_gpt.sh  # the same job on MindSpore
#   GPUS_PER_NODE=1 TRAIN_ITERS=5 LOG_INTERVAL=1 OUT_DIR=/tmp/demo bash scripts/pretrain_gpt.sh
#
# The corpus is tokenized into $OUT_DIR/data on the first run (Megatron's preprocess_data.py step).
# --load is --save, as in the guide's resume form: a second run continues from the newest checkpoint in
# $OUT_DIR/ckpt (a finished run has nothing left to do, and says so; remove $OUT_DIR/ckpt to start over).
# Left as in the guide on purpose, to show what mmrun does with them on a CPU: --distributed-backend
# nccl (gloo or mccl is used, with a notice) and --ckpt-format torch (safetensors is written, with a
# notice). Not carried over: --fp16. mmrun trains in fp16, but on a CPU it is slow, and with Megatron's
# first loss scale of 2^32 this 40-iteration run would spend its first ~17 iterations backing the scale
# off (add --fp16 to GPT_ARGS to see it; docs/training.md, "Mixed precision").
set -euo pipefail

AI_FRAMEWORK=${AI_FRAMEWORK:-pytorch}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=${GPUS_PER_NODE:-2}  # processes on this machine (CPU: one per core)
# Change for multinode config
MASTER_ADDR=localhost
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=1
NODE_RANK=0
WORLD_SIZE=$((GPUS_PER_NODE * NNODES))

OUT_DIR=${OUT_DIR:-./out/pretrain_gpt_$AI_FRAMEWORK}  # one per framework: MindSpore never resumes the PyTorch demo's checkpoint
TRAIN_ITERS=${TRAIN_ITERS:-40}
LOG_INTERVAL=${LOG_INTERVAL:-10}
CHECKPOINT_PATH=$OUT_DIR/ckpt
CORPUS_DIR=$ROOT/data/corpus
VOCAB_FILE=$CORPUS_DIR/gpt2-vocab.json
MERGE_FILE=$CORPUS_DIR/gpt2-merges.txt
DATA_PATH=$OUT_DIR/data/demo_text_document

if [ ! -f "$DATA_PATH.bin" ] || [ ! -f "$DATA_PATH.idx" ]; then
    mmrun preprocess-data \
        --input "$CORPUS_DIR/demo_corpus.jsonl" \
        --output-prefix "$OUT_DIR/data/demo" \
        --tokenizer-type GPT2BPETokenizer \
        --vocab-file "$VOCAB_FILE" \
        --merge-file "$MERGE_FILE" \
        --append-eod \
        --log-interval 1000 \
        --workers 1
fi

export LOCAL_WORLD_SIZE=$GPUS_PER_NODE
DISTRIBUTED_ARGS="
    --local_worker_num $GPUS_PER_NODE \
    --worker_num $WORLD_SIZE \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT \
    --log_dir msrun_log \
    --join True \
"

GPT_ARGS="
    --num-layers 2 \
    --hidden-size 64 \
    --num-attention-heads 4 \
    --seq-length 64 \
    --max-position-embeddings 64 \
    --micro-batch-size 4 \
    --global-batch-size $((4 * WORLD_SIZE)) \
    --lr 0.002 \
    --train-iters $TRAIN_ITERS \
    --lr-decay-iters $TRAIN_ITERS \
    --lr-decay-style cosine \
    --min-lr 1.0e-5 \
    --weight-decay 1e-2 \
    --lr-warmup-fraction .05 \
    --clip-grad 1.0 \
    --transformer-impl local \
"

DATA_ARGS="
    --data-path $DATA_PATH \
    --vocab-file $VOCAB_FILE \
    --merge-file $MERGE_FILE \
    --split 949,50,1 \
"

OUTPUT_ARGS="
    --log-interval $LOG_INTERVAL \
    --save-interval 20 \
    --eval-interval 20 \
    --eval-iters 2 \
"

# shellcheck disable=SC2086  # the *_ARGS strings are word-split on purpose, as in the guide
msrun $DISTRIBUTED_ARGS "$ROOT/models/pretrain_gpt.py" \
    $GPT_ARGS \
    $DATA_ARGS \
    $OUTPUT_ARGS \
    --distributed-backend nccl \
    --save "$CHECKPOINT_PATH" \
    --load "$CHECKPOINT_PATH" \
    --ckpt-format torch \
    --ai-framework mindspore
