"""torch's own FSDP2 (`fully_shard`, DeviceMesh) as mmrun's PyTorch engine for sharded data parallelism, and
torch's DDP for models trained as they are (transformers). torch only: the MindSpore gate refuses
--use-torch-fsdp2. DCP's save/load is a framework primitive and stays in backend/torch/fsdp2/dcp.py.

- sharding.py   the FSDP2 file's plan (engines/fsdp2_config.py) applied to a model: mesh, recompute, fully_shard
- engine.py     the engine of mmrun.engines (FSDP2 or DDP): optimizer, micro-batches, clipping, losses
- export.py     a DCP checkpoint read whole as numpy, or written as a Hugging Face directory (checkpoint/dcp.py)
"""
