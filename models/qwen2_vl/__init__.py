"""Qwen2-VL and Qwen2.5-VL on mmrun's portable API (PyTorch and MindSpore), equal to transformers.

    from mmrun.models.qwen2_vl import Qwen2VLForConditionalGeneration, from_pretrained
    model = from_pretrained("Qwen2-VL-2B-Instruct/")          # a Hugging Face directory
    out = model(**batch)                                       # {"logits", "loss_dict"}

Modules: configuration (VisionConfig, TextConfig, Qwen2VLConfig), modeling (the model, init, freeze),
hf_checkpoint (read and write Hugging Face directories), mm_layout (MindSpeed-MM's names), generation (its
Decoding). What the Qwen vision-language families share is in models/vlm/.
"""
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig, TextConfig, VisionConfig  # noqa: F401


def __getattr__(name: str):
    # The model and the checkpoint helpers import the chosen framework: load them on first use only, so
    # reading a config needs no framework.
    if name in ("Qwen2VLForConditionalGeneration", "load_hf_weights", "from_pretrained"):
        from mmrun.models.qwen2_vl import modeling
        return getattr(modeling, name)
    if name in ("init_weights", "causal_lm_loss"):  # shared by the Qwen vision-language families
        from mmrun.models.vlm import blocks
        return getattr(blocks, name)
    if name in ("load_hf_directory", "save_hf_directory", "is_hf_directory"):
        from mmrun.models.qwen2_vl import hf_checkpoint
        return getattr(hf_checkpoint, name)
    raise AttributeError(f"module 'mmrun.models.qwen2_vl' has no attribute {name!r}")
