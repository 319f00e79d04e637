"""What the Qwen vision-language families' configurations share: the activations their ViTs implement and the
sizes a ViT's fields give (Qwen2-VL's, Qwen3-VL's and Qwen2.5-Omni's VisionConfig derive from ViTShape)."""
from __future__ import annotations

# Activations the model implements (transformers' ACT2FN names).
ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh", "silu", "swish")


class ViTShape:
    """What a Qwen ViT's sizes give (a base of Qwen2-VL's and Qwen3-VL's VisionConfig, which hold the fields)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per pre-flattened patch: in_channels * temporal_patch_size * patch_size**2 (1176 for
        Qwen2-VL's 14-pixel patches, 1536 for Qwen3-VL's 16)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
