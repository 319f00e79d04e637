"""Wan2.1 video generation on mmrun's portable API (PyTorch and MindSpore), equal to diffusers.

    from mmrun.models.wan import WanTransformer3DModel
    model = WanTransformer3DModel.from_pretrained("Wan2.1-T2V-1.3B-Diffusers/transformer")
    noise_pred = model(hidden_states=latents, timestep=t, encoder_hidden_states=prompt_embeds)

Modules: configuration (WanTransformerConfig: diffusers' config.json and MindSpeed-MM's predictor),
transformer (the DiT, its init, its diffusers directories), mindspeed_names (MindSpeed-MM's WanDiT parameter and
LoRA target names <-> diffusers'), flow_match (MindSpeed-MM's training objective), model_json (pretrain_model.json
for training), convert (WanConverter for `mmrun convert`), scheduling_unipc (the sampling schedulers), sampling
(WanPipeline's denoising loop), vae (AutoencoderKLWan), text_encoder (UMT5), pipeline_json (the ae /
text_encoder / tokenizer blocks of MindSpeed-MM's jsons).
"""
from mmrun.models.wan.configuration import WanConfigError, WanTransformerConfig  # noqa: F401


def __getattr__(name: str):
    # The model imports the chosen framework: load it on first use only, so reading a config needs none.
    if name in ("WanTransformer3DModel", "DiffusersWeights", "parameter_shapes", "read_diffusers_weights",
                "load_diffusers_weights", "save_diffusers_directory", "is_diffusers_directory", "init_weights",
                "initial_state"):
        from mmrun.models.wan import transformer
        return getattr(transformer, name)
    raise AttributeError(f"module 'mmrun.models.wan' has no attribute {name!r}")
