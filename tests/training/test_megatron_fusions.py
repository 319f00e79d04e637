"""megatron-core's fused masked softmax is asked for only where its compiled kernel imports (issue 27, item 2).

On an H100 without Apex, GPTModel in bf16 died at its first attention: masked_softmax_fusion was on for every
CUDA run, and megatron-core's FusedScaleMaskSoftmax imports `scaled_masked_softmax_cuda` when it sees fp16/bf16
scores. These build the TransformerConfig the engine builds, with the real megatron-core, as on a CUDA machine
(the device kind is the one thing set by hand: there is no GPU here), and run megatron-core's softmax module
the way its DotProductAttention builds it from that config.
"""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("megatron.core")
import torch  # noqa: E402

from mmrun.backend.torch.megatron_core import runtime  # noqa: E402
from mmrun.engines.torch.megatron_core import gpt, vlm  # noqa: E402
from mmrun.training.arguments import parse_args  # noqa: E402

ARGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
        "--mock-data", "--use-mcore-models", "--bf16"]

CAUSAL = torch.triu(torch.ones(32, 32, dtype=torch.bool), diagonal=1)[None, None]  # True: masked out


@pytest.fixture
def on_cuda(monkeypatch):
    monkeypatch.setattr(runtime, "device_kind", lambda: "cuda")
    runtime.fused_softmax_kernels.cache_clear()
    yield
    runtime.fused_softmax_kernels.cache_clear()


def _softmax_of(config):
    """megatron-core's softmax module as DotProductAttention builds it from `config`."""
    from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.utils import attention_mask_func

    return FusedScaleMaskSoftmax(input_in_fp16=config.fp16, input_in_bf16=config.bf16,
                                 attn_mask_type=AttnMaskType.causal,
                                 scaled_masked_softmax_fusion=config.masked_softmax_fusion,
                                 mask_func=attention_mask_func, softmax_in_fp32=config.attention_softmax_in_fp32,
                                 scale=None)


def test_without_the_kernel_cuda_bf16_gets_the_unfused_softmax_and_one_notice(on_cuda):
    assert not runtime.fused_softmax_kernels()  # no Apex here: the real probe
    config = gpt.transformer_config(parse_args(ARGS))
    assert (config.masked_softmax_fusion, config.bias_activation_fusion, config.bias_dropout_fusion) == (
        False, True, True)  # the TorchScript fusions stay: they need no compiled extension
    scores = torch.randn(2, 4, 32, 32).to(torch.bfloat16)
    # the shapes the fused kernel takes: it would be chosen if asked for
    probs = _softmax_of(config)(scores, CAUSAL)
    assert torch.allclose(probs.float().sum(-1), torch.ones(2, 4, 32), atol=1e-2)
    notice = runtime.fusion_notice()
    assert notice and "scaled_masked_softmax_cuda" in notice and "unfused" in notice
    assert runtime.fusion_notice("cpu") is None  # the CPU never asks for the fused kernels


def test_the_old_flag_is_the_crash_the_h100_saw(on_cuda):
    """What ca72f9f did (fusion on for every CUDA run): megatron-core reaches for the kernel and dies."""
    config = gpt.transformer_config(parse_args(ARGS))
    config.masked_softmax_fusion = True
    with pytest.raises(ModuleNotFoundError, match="scaled_masked_softmax_cuda"):
        _softmax_of(config)(torch.randn(2, 4, 32, 32).to(torch.bfloat16), CAUSAL)


def test_where_the_kernels_import_the_fused_softmax_is_asked_for(on_cuda, tmp_path, monkeypatch):
    for name in runtime.SOFTMAX_KERNELS:  # importable modules of those names: what the probe asks of Apex
        (tmp_path / f"{name}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert runtime.fused_softmax_kernels()
        assert gpt.transformer_config(parse_args(ARGS)).masked_softmax_fusion
        assert vlm._common(parse_args(ARGS))["masked_softmax_fusion"]
        assert runtime.fusion_notice() is None
    finally:
        for name in runtime.SOFTMAX_KERNELS:
            sys.modules.pop(name, None)


def test_on_cpu_nothing_is_fused():
    runtime.fused_softmax_kernels.cache_clear()
    flags = runtime.fusions("cpu")
    assert flags == {"masked_softmax_fusion": False, "bias_activation_fusion": False, "bias_dropout_fusion": False}
