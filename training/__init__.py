"""mmrun.training: Megatron's pretraining loop for PyTorch and MindSpore.

- `arguments`: Megatron's argument names and meanings (megatron_flags.yaml: flags ignored or refused)
- `pretrain`: the shared `pretrain()` loop that calls an entry script's five callbacks
- `checkpointing`: Megatron's save_checkpoint/load_checkpoint in safetensors + JSON, verified loads, over
  `checkpoint_store` (the save sequence that no kill can break, recovery, what --load resumes from) and
  `checkpoint_layout` (Megatron's names on disk: the tracker, iter_XXXXXXX, mp_rank_XX[_YYY])
- `training_log`: Megatron's log lines, the --metrics-file, a parser for both
- `global_vars`: `get_args()`, `get_tokenizer()`, `print_rank_0()` for the callbacks

No framework is imported here: the loop loads the chosen one (`mmrun.backend`) when it runs.
"""
from mmrun.training.global_vars import get_args, get_tokenizer, print_rank_0
from mmrun.training.pretrain import ModelType, TrainingResult, pretrain

__all__ = ["ModelType", "TrainingResult", "get_args", "get_tokenizer", "pretrain", "print_rank_0"]
