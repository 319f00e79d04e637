"""Which megatron-core stage builds each Qwen vision-language family (STAGES) and this rank's stage of it
(vlm_model): above vlm.py (Qwen2-VL / Qwen2.5-VL) and qwen3_vlm.py (Qwen3-VL, built on vlm.py), so neither
imports the other's user.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from mmrun.backend.errors import UsageError
from mmrun.backend.torch.megatron_core import runtime
from mmrun.engines.torch.megatron_core import omni_vlm, qwen3_vl_moe, qwen3_vlm, vlm
from mmrun.models import families

# family (models/families.py) -> its megatron-core stage
STAGES: dict[str, Any] = {"qwen2_vl": vlm.Qwen2VLStage, "qwen3_vl": qwen3_vlm.Qwen3VLStage,
                          "qwen2_5_omni": omni_vlm.OmniStage}


def vlm_model(args: Any, layout: Any, pre_process: bool, post_process: bool,
              read_hf: Callable[[str], np.ndarray] | None = None, vp_stage: int | None = None) -> Any:
    """This rank's stage (virtual chunk `vp_stage`) of the model, its weights from the seed (or from an HF
    directory's tensors)."""
    from megatron.core import parallel_state as ps

    from mmrun.models.vlm import mm_layout
    from mmrun.engines.torch.megatron_core.gpt import load_numpy_state

    runtime.require_parallel_state()
    refused = {"--context-parallel-size": (
                   args.context_parallel_size or 1,
                   "the ViT's features are put into the whole sequence on the first stage")}
    for flag, (size, why) in refused.items():
        if size > 1:
            raise UsageError(f"{flag} {size} is not built for the vision-language model ({why}). Received: "
                             f"{flag} {size}; use tensor, pipeline and data parallelism (set it to 1)")
    family = families.family_of(layout.config).name
    if family == "qwen3_vl":  # DeepStack, QK-norm, interleaved M-RoPE
        qwen3_vlm.check_qwen3(args, layout)
    model = STAGES[family](args, layout, pre_process, post_process, vp_stage)
    tp_rank, pp_rank, chunk = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank(), vp_stage or 0
    if read_hf is not None:
        state = mm_layout.rank_state_from_hf(layout, read_hf, tp_rank, pp_rank, vp_stage=chunk)
    else:
        state = mm_layout.initial_state(layout, args.seed, tp_rank, pp_rank, std=args.init_method_std, vp_stage=chunk)
    if family == "qwen3_vl":  # the MoE variant: this expert-parallel rank's experts, numbered from 0
        state = qwen3_vl_moe.local_state(layout, state)
    load_numpy_state(model, state)
    return model
