"""torch's own FSDP2 (`fully_shard`, DeviceMesh, torch.distributed.checkpoint) as mmrun's PyTorch engine for
sharded data parallelism, and torch's DDP for models trained as they are (transformers). torch only: the
MindSpore gate refuses --use-torch-fsdp2 (FRAMEWORK_ONLY in backend/torch/__init__.py).

- sharding.py   the FSDP2 file's plan applied to a model: mesh, recompute, fully_shard per unit, prefetch
- engine.py     the engine of training/engines/ (FSDP2 or DDP): optimizer, micro-batches, clipping, losses
- dcp.py        --ckpt-format torch_dcp: sharded save/load, and a DCP directory read whole (no process group)
"""
