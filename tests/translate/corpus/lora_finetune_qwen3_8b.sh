#!/bin/bash
# corpus: LoRA instruction fine-tune in the style of MindSpeed-LLM (posttrain_gpt.py, PP 2, recompute, LoRA on all linears)
# corpus-reported: none
export CUDA_DEVICE_MAX_CONNECTIONS=1

NPUS_PER_NODE=8
MASTER_ADDR=localhost
MASTER_PORT=6000
NNODES=1
NODE_RANK=0
WORLD_SIZE=$(($NPUS_PER_NODE*$NNODES))

CKPT_LOAD_DIR="./model_weights/qwen3-8b-mcore"
CKPT_SAVE_DIR="./ckpt/qwen3-8b-lora"
DATA_PATH="./finetune_dataset/alpaca"
TOKENIZER_PATH="./model_from_hf/qwen3-8b"

TP=1
PP=2

DISTRIBUTED_ARGS=(
    --nproc_per_node "$NPUS_PER_NODE"
    --nnodes "$NNODES"
    --node_rank "$NODE_RANK"
    --master_addr "$MASTER_ADDR"
    --master_port "$MASTER_PORT"
)

GPT_ARGS=(
    --use-mcore-models
    --spec mindspeed_llm.tasks.models.spec.qwen3_spec layer_spec
    --tensor-model-parallel-size "${TP}"
    --pipeline-model-parallel-size "${PP}"
    --sequence-parallel
    --use-distributed-optimizer
    --use-flash-attn
    --num-layers 36
    --hidden-size 4096
    --num-attention-heads 32
    --ffn-hidden-size 12288
    --seq-length 4096
    --max-position-embeddings 32768
    --micro-batch-size 1
    --global-batch-size 16
    --swiglu
    --normalization RMSNorm
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --tokenizer-type PretrainedFromHF
    --tokenizer-name-or-path "${TOKENIZER_PATH}"
    --lr 1.25e-6
    --train-iters 2000
    --bf16
)

LORA_ARGS=(
    --lora-r 8
    --lora-alpha 16
    --lora-fusion
    --lora-target-modules linear_qkv linear_proj linear_fc1 linear_fc2
)

TUNE_ARGS=(
    --finetune
    --stage sft
    --is-instruction-dataset
    --prompt-type qwen3
    --variable-seq-lengths
)

torchrun "${DISTRIBUTED_ARGS[@]}" posttrain_gpt.py \
    "${GPT_ARGS[@]}" \
    "${LORA_ARGS[@]}" \
    "${TUNE_ARGS[@]}" \
    --data-path "$DATA_PATH" \
    --distributed-backend nccl \
    --load "${CKPT_LOAD_DIR}" \
    --save "${CKPT_SAVE_DIR}" \
    | tee logs/tune_qwen3_8b_lora.log
