"""Forward + backward of mmrun's Qwen2.5-Omni thinker on whichever framework this process chose
(MMRUN_AI_FRAMEWORK). Imported by the tests for PyTorch; run as a script for MindSpore (one subprocess):
`python qwen2_5_omni_run.py CASES.npz OUT.npz`, CASES.npz holding per case `<c>` the model directory `<c>/dir`
and the batch arrays `<c>/<key>`; OUT.npz gets `<c>/logits`, `<c>/loss` and `<c>/grad/<parameter>`."""
from __future__ import annotations

import sys

import numpy as np

from mmrun.backend import autograd, tensors


def forward_backward(model, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """logits, loss and the gradient of every trainable parameter, as numpy."""
    inputs = {k: (bool(v) if k == "use_audio_in_video" else tensors.from_numpy(v)) for k, v in batch.items()}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]

    def loss_fn():
        out = model(**inputs)
        return out["loss_dict"]["loss"], out["logits"]

    (loss, logits), grads = autograd.value_and_grad(loss_fn, [p for _, p in named], has_aux=True)()
    result = {"logits": tensors.to_numpy(logits), "loss": tensors.to_numpy(loss)}
    result.update({f"grad/{n}": tensors.to_numpy(g) for (n, _), g in zip(named, grads)})
    return result


def generate(model, prompt: dict[str, np.ndarray], new_tokens: int = 6, use_cache: bool = True) -> np.ndarray:
    """Greedy new tokens of mmrun's generation loop for one prompt (tiny_omni.prompt's keys)."""
    from mmrun.models.qwen2_5_omni.generation import OmniPrompt
    from mmrun.models.vlm.generation import GenerationConfig, Generator

    fields = {("second_per_grid_ts" if k == "video_second_per_grid" else k): (bool(v) if k == "use_audio_in_video"
                                                                             else v) for k, v in prompt.items()}
    return np.array(Generator(model).generate(OmniPrompt(**fields),
                                              GenerationConfig(max_new_tokens=new_tokens, use_cache=use_cache)))


def run_cases(cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from mmrun.models.qwen2_5_omni import from_pretrained

    out: dict[str, np.ndarray] = {}
    models = {}
    for case in sorted({k.split("/", 1)[0] for k in cases}):
        fields = {k.split("/", 1)[1]: v for k, v in cases.items() if k.startswith(case + "/")}
        path, kind = str(fields.pop("dir")), str(fields.pop("kind", "forward"))
        if path not in models:
            models[path] = from_pretrained(path)
        result = ({"tokens": generate(models[path], fields)} if kind == "generate"
                  else forward_backward(models[path], fields))
        out.update({f"{case}/{k}": v for k, v in result.items()})
    return out


if __name__ == "__main__":
    np.savez(sys.argv[2], **run_cases(dict(np.load(sys.argv[1], allow_pickle=False))))
