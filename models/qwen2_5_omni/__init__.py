"""Qwen2.5-Omni's thinker (audio, images, video and text in, text out) on mmrun's portable API (PyTorch and
MindSpore), equal to transformers' Qwen2_5OmniThinkerForConditionalGeneration.

    from mmrun.models.qwen2_5_omni import from_pretrained
    model = from_pretrained("Qwen2.5-Omni-7B/")     # a whole model as downloaded, or a thinker directory
    out = model(**batch)                            # {"logits", "loss_dict"}

Modules: configuration (AudioConfig, OmniConfig), modeling (the audio encoder and the thinker, built on the
Qwen2-VL family's vision tower and decoder), hf_checkpoint (the name table and the reader). TMRoPE positions:
mmrun.data.multimodal.omni_rope_index.
"""
from mmrun.models.qwen2_5_omni.configuration import AudioConfig, OmniConfig  # noqa: F401


def __getattr__(name: str):
    # The model imports the chosen framework: load it on first use only, so reading a config needs none.
    if name in ("Qwen2_5OmniThinkerForConditionalGeneration", "init_weights", "load_hf_weights", "from_pretrained"):
        from mmrun.models.qwen2_5_omni import modeling
        return getattr(modeling, name)
    if name in ("load_hf_directory", "is_hf_directory", "load_hf_config"):
        from mmrun.models.qwen2_5_omni import hf_checkpoint
        return getattr(hf_checkpoint, name)
    raise AttributeError(f"module 'mmrun.models.qwen2_5_omni' has no attribute {name!r}")
