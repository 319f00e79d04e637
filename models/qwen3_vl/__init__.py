"""Qwen3-VL (dense, and its MoE variant Qwen3-VL-30B-A3B / 235B-A22B) on mmrun's portable API (PyTorch and
MindSpore), equal to transformers.

    from mmrun.models.qwen3_vl import from_pretrained
    model = from_pretrained("Qwen3-VL-8B-Instruct/")          # a Hugging Face directory
    out = model(**batch)                                       # {"logits", "loss_dict"}

Modules: configuration (VisionConfig, TextConfig, Qwen3VLConfig), modeling (the model, freeze, loading),
hf_checkpoint (reading Hugging Face directories), moe (the MoE variant's sparse blocks: a `qwen3_vl_moe` directory
loads through the same from_pretrained).
"""
from mmrun.models.qwen3_vl.configuration import Qwen3VLConfig, TextConfig, VisionConfig  # noqa: F401


def __getattr__(name: str):
    # The model imports the chosen framework: load it on first use only, so reading a config needs none.
    if name == "init_weights":  # shared by the Qwen vision-language families
        from mmrun.models.vlm import blocks
        return blocks.init_weights
    if name in ("Qwen3VLForConditionalGeneration", "load_hf_weights", "from_pretrained"):
        from mmrun.models.qwen3_vl import modeling
        return getattr(modeling, name)
    if name in ("load_hf_directory", "load_hf_config", "is_hf_directory", "hf_parameter_names"):
        from mmrun.models.qwen3_vl import hf_checkpoint
        return getattr(hf_checkpoint, name)
    raise AttributeError(f"module 'mmrun.models.qwen3_vl' has no attribute {name!r}")
