"""A ViT patch embedding written once against the portable API (proves Conv2d on both frameworks).

(B, C, H, W) images -> (B, num_patches, hidden_size) patch tokens plus learned position embeddings,
as in Megatron's ViT: a Conv2d with kernel = stride = patch_size, flattened and transposed.
"""
from __future__ import annotations

from mmrun.backend import nn, ops


class PatchEmbedding(nn.Module):
    def __init__(self, image_size: int = 32, patch_size: int = 4, in_channels: int = 3,
                 hidden_size: int = 64, init_method_std: float = 0.02) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not divisible by patch_size {patch_size}; change one of them")
        self.num_patches = (image_size // patch_size) ** 2
        self.proj = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)
        self.position_embeddings = nn.Parameter(ops.zeros((1, self.num_patches, hidden_size)))
        nn.normal_(self.position_embeddings, 0.0, init_method_std)

    def forward(self, images):
        x = self.proj(images)  # (B, hidden, H/p, W/p)
        x = ops.transpose(ops.flatten(x, 2), 1, 2)  # (B, num_patches, hidden)
        return x + self.position_embeddings
