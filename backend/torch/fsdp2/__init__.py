"""torch's distributed checkpoint (DCP) for FSDP2: a framework primitive, model-free (the FSDP2 engine itself is
in engines/torch/fsdp2/).

- dcp.py        --ckpt-format torch_dcp: sharded save/load, and a DCP directory read whole (no process group)
"""
