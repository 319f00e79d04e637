"""Forward + backward of mmrun's Qwen2-VL on whichever framework this process chose (MMRUN_AI_FRAMEWORK).

Imported by the tests for PyTorch (in the pytest process) and run as a script for MindSpore (one
subprocess): `python qwen2_vl_run.py CASES.npz OUT.npz`, where CASES.npz holds, per case `<c>`, its kind, the
model directory `<c>/dir` and the batch arrays `<c>/<key>`; OUT.npz gets the results under `<c>/` (see run_cases).
"""
from __future__ import annotations

import sys

import numpy as np

from mmrun.backend import autograd, tensors

FLOAT_KEYS = ("pixel_values", "pixel_values_videos", "second_per_grid_ts")
MODEL_KEYS = ("input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw", "pixel_values_videos",
              "video_grid_thw", "second_per_grid_ts", "position_ids")


def forward_backward(model, batch: dict[str, np.ndarray], per_token: bool = False) -> dict[str, np.ndarray]:
    """logits, loss (and num_tokens) and gradients of the trainable parameters, as numpy."""
    inputs = {k: tensors.from_numpy(v) for k, v in batch.items() if k in MODEL_KEYS}
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [p for n, p in model.named_parameters() if p.requires_grad]

    def loss_fn():
        out = model(**inputs, calculate_per_token_loss=per_token)
        return out["loss_dict"]["loss"], (out["logits"], out["loss_dict"].get("num_tokens", out["loss_dict"]["loss"]))

    (loss, (logits, count)), grads = autograd.value_and_grad(loss_fn, params, has_aux=True)()
    result = {"logits": tensors.to_numpy(logits), "loss": tensors.to_numpy(loss), "num_tokens": tensors.to_numpy(count)}
    result.update({f"grad/{n}": tensors.to_numpy(g) for n, g in zip(names, grads)})
    return result


def freeze_and_step(model, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """MindSpeed-MM's default freeze (ViT frozen), an AdamW over model.named_parameters(), one step:
    which parameters the optimizer holds, and how far frozen and trained parameters moved."""
    from mmrun.backend import optim

    counts = model.freeze()
    optimizer = optim.AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.1)
    before = {n: tensors.to_numpy(p).copy() for n, p in model.named_parameters()}
    inputs = {k: tensors.from_numpy(v) for k, v in batch.items() if k in MODEL_KEYS}
    _, grads = autograd.value_and_grad(lambda: model(**inputs)["loss_dict"]["loss"], optimizer.params)()
    optimizer.step(grads)
    moved = {n: np.abs(tensors.to_numpy(p) - before[n]).max() for n, p in model.named_parameters()}
    trained = set(optimizer.names)
    return {"optimizer_names": np.array(optimizer.names), "state_keys": np.array(sorted(optimizer.state_dict()["tensors"])),
            "frozen_moved": np.float32(max(v for n, v in moved.items() if n not in trained)),
            "trained_moved": np.float32(min(v for n, v in moved.items() if n in trained and not n.endswith("bias"))),
            "frozen_counts": np.array([counts["vision_encoder"], counts["vision_projector"], counts["text_decoder"]]),
            "requires_grad": np.array([n for n, p in model.named_parameters() if p.requires_grad])}


def lora_steps(model, batch: dict[str, np.ndarray], steps: int = 3) -> dict[str, np.ndarray]:
    """MindSpeed-MM's Qwen2-VL LoRA targets (linear_qkv linear_proj linear_fc1 linear_fc2) on the model, AdamW
    over what trains, `steps` steps on the batch: the losses, the adapters after, how far the base moved."""
    from mmrun.backend import optim
    from mmrun.models import lora
    from mmrun.checkpoint.peft import LORA_TARGETS

    targets = lora.expand_targets(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"], LORA_TARGETS)
    adapted = lora.apply_lora(model, targets, r=4, alpha=8, seed=5)
    before = {n: tensors.to_numpy(p).copy() for n, p in model.named_parameters() if not p.requires_grad}
    optimizer = optim.AdamW(model.named_parameters(), lr=1e-2, weight_decay=0.0)
    inputs = {k: tensors.from_numpy(v) for k, v in batch.items() if k in MODEL_KEYS}
    losses = []
    for _ in range(steps):
        loss, grads = autograd.value_and_grad(lambda: model(**inputs)["loss_dict"]["loss"], optimizer.params)()
        optimizer.step(grads)
        losses.append(float(tensors.to_numpy(loss)))
    base_moved = max(float(np.abs(tensors.to_numpy(p) - before[n]).max()) for n, p in model.named_parameters()
                     if n in before)
    return {"losses": np.array(losses), "adapted": np.array(adapted), "optimizer_names": np.array(optimizer.names),
            "base_moved": np.float32(base_moved),
            **{f"adapter/{k}": v for k, v in lora.adapter_state(model).items()}}


def initialised(config_dir: str, seed: int) -> dict[str, np.ndarray]:
    """init_weights(seed) of a model built from the directory's config: every parameter, and their order."""
    from mmrun.models.qwen2_vl import Qwen2VLForConditionalGeneration, init_weights
    from mmrun.models.qwen2_vl.hf_checkpoint import load_hf_config

    model = Qwen2VLForConditionalGeneration(load_hf_config(config_dir))
    init_weights(model, seed)
    state = {f"param/{n}": tensors.to_numpy(p) for n, p in model.named_parameters()}
    return {**state, "names": np.array([n for n, _ in model.named_parameters()])}


def from_pretrained(path: str):
    """mmrun's model of the directory's model_type: Qwen3-VL, or Qwen2-VL / Qwen2.5-VL."""
    import json
    import os

    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        qwen3 = json.load(f).get("model_type") in ("qwen3_vl", "qwen3_vl_moe")
    if qwen3:
        from mmrun.models.qwen3_vl import from_pretrained as load
    else:
        from mmrun.models.qwen2_vl import from_pretrained as load
    return load(path)


def run_cases(cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each case `<c>`: `<c>/kind` forward (default) | freeze | lora | init, `<c>/dir`, and the batch arrays."""
    out: dict[str, np.ndarray] = {}
    for case in sorted({k.split("/", 1)[0] for k in cases}):
        fields = {k.split("/", 1)[1]: v for k, v in cases.items() if k.startswith(case + "/")}
        kind, path = str(fields.pop("kind", "forward")), str(fields.pop("dir"))
        per_token = bool(fields.pop("per_token", np.array(False)))
        if kind == "init":
            result = initialised(path, int(fields["seed"]))
        elif kind == "lora":
            result = lora_steps(from_pretrained(path), fields)
        elif kind == "freeze":
            result = freeze_and_step(from_pretrained(path), fields)
        else:
            result = forward_backward(from_pretrained(path), fields, per_token)
        out.update({f"{case}/{k}": v for k, v in result.items()})
    return out


if __name__ == "__main__":
    loaded = dict(np.load(sys.argv[1], allow_pickle=False))
    np.savez(sys.argv[2], **run_cases(loaded))
