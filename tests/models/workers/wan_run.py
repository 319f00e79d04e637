"""Forward + backward of mmrun's Wan transformer on whichever framework this process chose (MMRUN_AI_FRAMEWORK).

Imported by the tests for PyTorch (in the pytest process) and run as a script for MindSpore (one subprocess):
`python wan_run.py CASES.npz OUT.npz`, where CASES.npz holds, per case `<c>`, the diffusers directory `<c>/dir`
and the inputs `<c>/<argument>` plus `<c>/cotangent`; OUT.npz gets `<c>/output` and `<c>/grad/<parameter>`
(or, for a case with `<c>/seed`, the initial weights `<c>/param/<parameter>`).
"""
from __future__ import annotations

import sys

import numpy as np

from mmrun.backend import autograd, ops, tensors

INPUTS = ("hidden_states", "timestep", "encoder_hidden_states", "encoder_hidden_states_image")


def forward_backward(path: str, fields: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The output and the gradients of sum(output * cotangent) for every parameter, as numpy."""
    from mmrun.models.wan import WanTransformer3DModel

    model = WanTransformer3DModel.from_pretrained(path)
    inputs = {k: tensors.from_numpy(v) for k, v in fields.items() if k in INPUTS}
    cotangent = tensors.from_numpy(fields["cotangent"])
    names, params = zip(*model.named_parameters())

    def loss_fn():
        out = model(**inputs)
        return ops.sum(out * cotangent), out

    (_, out), grads = autograd.value_and_grad(loss_fn, list(params), has_aux=True)()
    result = {"output": tensors.to_numpy(out)}
    result.update({f"grad/{n}": tensors.to_numpy(g) for n, g in zip(names, grads)})
    return result


def initialised(path: str, seed: int) -> dict[str, np.ndarray]:
    """init_weights(seed) of a model built from the directory's config: every parameter."""
    from mmrun.models.wan import WanTransformer3DModel, WanTransformerConfig, init_weights

    model = WanTransformer3DModel(WanTransformerConfig.from_diffusers(path))
    init_weights(model, seed)
    return {f"param/{n}": tensors.to_numpy(p) for n, p in model.named_parameters()}


def run_cases(cases: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each case `<c>`: `<c>/dir`, and either `<c>/seed` (init_weights) or the inputs (forward_backward)."""
    out: dict[str, np.ndarray] = {}
    for case in sorted({k.split("/", 1)[0] for k in cases}):
        fields = {k.split("/", 1)[1]: v for k, v in cases.items() if k.startswith(case + "/")}
        path = str(fields.pop("dir"))
        result = initialised(path, int(fields["seed"])) if "seed" in fields else forward_backward(path, fields)
        out.update({f"{case}/{k}": v for k, v in result.items()})
    return out


if __name__ == "__main__":
    np.savez(sys.argv[2], **run_cases(dict(np.load(sys.argv[1], allow_pickle=False))))
