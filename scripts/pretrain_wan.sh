#!/bin/bash
# Wan2.1 text-to-video, MindSpeed-MM's four steps on a CPU and fully offline, in minutes:
#   0. scripts/wan/make_demo.py draws captioned clips ("a red square moves right": a coloured shape moving in the
#      direction its caption names) and writes a tiny Wan Diffusers directory (vae/: weights set by hand so that
#      it reconstructs these clips, scripts/wan/shape_vae.py; text_encoder/: random; tokenizer/) and
#      MindSpeed-MM's jsons;
#   1. feature extraction  (examples/wan2.1/feature_extract/feature_extraction.sh: get_wan_feature.py)
#   2. training            (examples/wan2.1/1.3b/t2v/pretrain.sh: pretrain_sora.py) of a tiny DiT from scratch
#   3. sampling            (examples/wan2.1/1.3b/t2v/inference.sh: inference_sora.py) -> $OUT_DIR/samples/*.mp4
#   4. scripts/wan/check_samples.py: does each video show its prompt's colour moving its way (the colour's
#      centroid, frame by frame)? One line per prompt; exit 1 when one does not.
# Each launch line is MindSpeed-MM's with `mmrun` in torchrun's place: AI_FRAMEWORK picks PyTorch (torchrun) or
# MindSpore (msrun) for every step; the models are mmrun's own on both.
#
#   bash scripts/pretrain_wan.sh                           # PyTorch
#   AI_FRAMEWORK=mindspore bash scripts/pretrain_wan.sh    # the same job on MindSpore
#   TRAIN_ITERS=100 OUT_DIR=/tmp/wan bash scripts/pretrain_wan.sh  # every step in minutes; too few to learn the motion
#
# 2,000 iterations pass the check (4/4 prompts): about 3.5 minutes on PyTorch on a 2-core CPU, 13 on MindSpore
# (a training iteration 0.32 s there against PyTorch's 0.09 s); with 1,000 or fewer the DiT has
# not yet learnt which way the squares move (docs/generation.md, "The offline demo").
#
# With a real Wan2.1 instead: the Diffusers directory's vae/, text_encoder/, tokenizer/ in model_t2v.json and
# inference_model.json, --load its transformer/ for training and sampling, and MindSpeed-MM's sizes.
set -euo pipefail

AI_FRAMEWORK=${AI_FRAMEWORK:-pytorch}
# One thread per process: the demo's tensors are tiny, and on a busy machine two OpenMP threads waiting on each
# other made a training iteration 19x slower (4.8 s against 0.25 s, measured on a shared 2-core CPU at load 11).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

NPUS_PER_NODE=${NPUS_PER_NODE:-1}
MASTER_ADDR=localhost
MASTER_PORT=${MASTER_PORT:-6000}
NNODES=1
NODE_RANK=0
WORLD_SIZE=$((NPUS_PER_NODE * NNODES))

OUT_DIR=${OUT_DIR:-./out/pretrain_wan_$AI_FRAMEWORK}
TRAIN_ITERS=${TRAIN_ITERS:-2000}
VIDEOS=${VIDEOS:-64}
SAVE_PATH=$OUT_DIR/ckpt

if [ ! -f "$OUT_DIR/inference_model.json" ]; then
    python "$ROOT/scripts/wan/make_demo.py" "$OUT_DIR" --videos "$VIDEOS"
fi

TP=1
PP=1
CP=1
MBS=${MBS:-4}
GBS=$((WORLD_SIZE * MBS * 2))

DISTRIBUTED_ARGS="
    --nproc_per_node $NPUS_PER_NODE \
    --nnodes $NNODES \
    --node_rank $NODE_RANK \
    --master_addr $MASTER_ADDR \
    --master_port $MASTER_PORT
"

# --- 1. feature extraction (feature_extraction.sh) -------------------------------------------------------------
EXTRACT_ARGS="
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --micro-batch-size ${MBS} \
    --global-batch-size $((WORLD_SIZE * MBS)) \
    --num-workers 8 \
"
if [ ! -f "$OUT_DIR/sora_features/data.jsonl" ]; then
    # shellcheck disable=SC2086  # the *_ARGS strings are word-split on purpose, as in MindSpeed-MM's scripts
    mmrun --ai-framework "$AI_FRAMEWORK" $DISTRIBUTED_ARGS "$ROOT/models/get_wan_feature.py" \
        $EXTRACT_ARGS \
        --mm-data "$OUT_DIR/data.json" \
        --mm-model "$OUT_DIR/model_t2v.json" \
        --mm-tool "$OUT_DIR/tools.json" \
        --distributed-backend nccl
fi

# --- 2. training (pretrain.sh; the model comes from pretrain_model.json) ---------------------------------------
GPT_ARGS="
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --micro-batch-size ${MBS} \
    --global-batch-size ${GBS} \
    --num-workers 8 \
    --lr 2e-3 \
    --min-lr 2e-3 \
    --adam-beta1 0.9 \
    --adam-beta2 0.999 \
    --adam-eps 1e-8 \
    --lr-decay-style constant \
    --weight-decay 1e-2 \
    --lr-warmup-init 0 \
    --lr-warmup-iters 0 \
    --clip-grad 1.0 \
    --train-iters ${TRAIN_ITERS} \
    --seed 1234 \
    --attention-mask-type general \
"
OUTPUT_ARGS="
    --log-interval 25 \
    --save-interval ${TRAIN_ITERS} \
    --eval-interval 10000 \
    --eval-iters 0 \
    --save ${SAVE_PATH} \
    --ckpt-format torch \
"
# shellcheck disable=SC2086
mmrun --ai-framework "$AI_FRAMEWORK" $DISTRIBUTED_ARGS "$ROOT/models/pretrain_sora.py" \
    $GPT_ARGS \
    --mm-data "$OUT_DIR/feature_data.json" \
    --mm-model "$OUT_DIR/pretrain_model.json" \
    --mm-tool "$OUT_DIR/tools.json" \
    $OUTPUT_ARGS \
    --distributed-backend nccl

# --- 3. sampling (inference.sh; prompts, size and scheduler in inference_model.json) ----------------------------
# shellcheck disable=SC2086
mmrun --ai-framework "$AI_FRAMEWORK" $DISTRIBUTED_ARGS "$ROOT/models/inference_sora.py" \
    --mm-model "$OUT_DIR/inference_model.json" \
    --tensor-model-parallel-size ${TP} \
    --pipeline-model-parallel-size ${PP} \
    --context-parallel-size ${CP} \
    --micro-batch-size ${MBS} \
    --global-batch-size $((WORLD_SIZE * MBS)) \
    --attention-mask-type general \
    --load "$SAVE_PATH"

echo "samples: $(cd "$OUT_DIR/samples" && pwd) ($(cat "$OUT_DIR/prompts.txt" | tr '\n' ';'))"

# --- 4. what the videos show ------------------------------------------------------------------------------------
python "$ROOT/scripts/wan/check_samples.py" "$OUT_DIR" \
    || echo "(not every video shows its prompt yet: the tiny DiT learns colour and axis first, which way later)"
