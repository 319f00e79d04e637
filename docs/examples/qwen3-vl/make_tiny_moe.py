"""A tiny random Qwen3-VL MoE saved by transformers (8 experts, 2 per token, the load-balancing loss on), and
transformers' own logits, loss and gradients for one batch, for compare.py."""
import numpy as np
import torch
import transformers

transformers.utils.logging.disable_progress_bar()  # no progress bar in the output

torch.manual_seed(0)
config = transformers.Qwen3VLMoeConfig(
    text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=256, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=16, output_router_logits=True, router_aux_loss_coef=0.01,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2],
                                      "mrope_interleaved": True}),
    vision_config=dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=4, out_hidden_size=32,
                       num_position_embeddings=16, deepstack_visual_indexes=[0, 2]),
    image_token_id=250, video_token_id=253, vision_start_token_id=251, vision_end_token_id=252,
    tie_word_embeddings=False)
model = transformers.Qwen3VLMoeForConditionalGeneration(config)
model.save_pretrained("tiny-qwen3-vl")

rng = np.random.default_rng(0)
ids = np.array([[5, 6, 7, 251] + [250] * 12 + [252, 8, 9, 10, 11]])  # text, a 6 x 8-patch image (12 tokens), text
batch = {"input_ids": ids, "attention_mask": np.ones_like(ids), "labels": ids,
         "pixel_values": rng.standard_normal((48, 3 * 2 * 16 * 16)).astype(np.float32),
         "image_grid_thw": np.array([[1, 6, 8]]), "mm_token_type_ids": (ids == 250).astype(np.int64)}
out = model(**{k: torch.from_numpy(v) for k, v in batch.items()})
out.loss.backward()
grads = {f"grad/{n}": p.grad.reshape(p.shape[0], -1).numpy() for n, p in model.named_parameters()}
np.savez("reference.npz", logits=out.logits.detach().numpy(), loss=out.loss.detach().numpy(), **batch, **grads)
experts = model.model.language_model.layers[0].mlp.experts
print(f"transformers {transformers.__version__}: saved tiny-qwen3-vl/ (experts.gate_up_proj "
      f"{tuple(experts.gate_up_proj.shape)}, experts.down_proj {tuple(experts.down_proj.shape)}), "
      f"loss {out.loss.item():.6f} with aux loss {out.aux_loss.item():.6f} x 0.01")
