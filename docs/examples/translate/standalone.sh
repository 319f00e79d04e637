#!/bin/bash
MEGATRON=/opt/Megatron-LM
PYTHONPATH=$MEGATRON:$PYTHONPATH python -u -m torch.distributed.run --standalone --nproc-per-node 4 \
    pretrain_gpt.py --tensor-model-parallel-size 1
