"""mmrun.training: Megatron's pretraining loop for PyTorch and MindSpore.

- `arguments`: Megatron's argument names and meanings (megatron_flags.yaml: flags ignored or refused)
- `pretrain`: the shared `pretrain()` loop that calls an entry script's five callbacks
- `checkpointing`: Megatron's save_checkpoint/load_checkpoint in safetensors + JSON, verified loads, over
  `checkpoint_store` (the save sequence that no kill can break, recovery, what --load resumes from) and
  `checkpoint_layout` (Megatron's names on disk: the tracker, iter_XXXXXXX, mp_rank_XX[_YYY])
- `training_log`: Megatron's log lines, the --metrics-file, a parser for both
- `global_vars`: `get_args()`, `get_tokenizer()`, `print_rank_0()` for the callbacks
- what runs the model is the floor below, `mmrun.engines` (mmrun's own for data parallelism; megatron-core
  on PyTorch for tensor, pipeline, context parallelism and the distributed optimizer), picked through its
  registry behind one small seam (engines/base.py); training never imports an engine's framework code
- `parallel`: Megatron's pipeline/context-parallel helpers for an entry's get_batch
- `checkpoint_reshard`: checkpoints across layouts and engines (models/gpt_names.py; the converter commands are in checkpoint/)

No framework is imported here: the loop loads the chosen one (`mmrun.backend`) when it runs.
"""
from mmrun.training.global_vars import get_args, get_tokenizer, print_rank_0
from mmrun.training.parallel import (core_gpt_model, core_vlm_model, get_batch_on_this_cp_rank,
                                    is_first_or_last_pipeline_stage, model_vp_stage)
from mmrun.training.arguments import ModelSource
from mmrun.training.pretrain import ModelType, TrainingResult, pretrain

__all__ = ["ModelSource", "ModelType", "TrainingResult", "core_gpt_model", "core_vlm_model", "get_args", "get_batch_on_this_cp_rank", "get_tokenizer",
           "is_first_or_last_pipeline_stage", "model_vp_stage", "pretrain", "print_rank_0"]
