"""mmrun.training: Megatron's pretraining loop for PyTorch and MindSpore.

- `arguments`: Megatron's argument names and meanings (megatron_flags.yaml: flags ignored or refused)
- `pretrain`: the shared `pretrain()` loop that calls an entry script's five callbacks
- `checkpointing`: Megatron's checkpoint layout in safetensors + JSON, atomic saves, verified loads
- `training_log`: Megatron's log lines, the --metrics-file, a parser for both
- `global_vars`: `get_args()`, `get_tokenizer()`, `print_rank_0()` for the callbacks

No framework is imported here: the loop loads the chosen one (`mmrun.backend`) when it runs.
"""
from mmrun.training.global_vars import get_args, get_tokenizer, print_rank_0
from mmrun.training.pretrain import ModelType, TrainingResult, pretrain

__all__ = ["ModelType", "TrainingResult", "get_args", "get_tokenizer", "pretrain", "print_rank_0"]
