"""The Wan2.1 video VAE (diffusers' `AutoencoderKLWan`) on mmrun's portable API: PyTorch and MindSpore.

    vae = AutoencoderKLWan.from_pretrained("Wan2.1-T2V-1.3B-Diffusers/vae")
    z = vae.encode(video)                      # (b, 3, 1+4k, H, W) in [-1, 1] -> (b, z_dim, 1+k, H/8, W/8): the mode
    z = vae.normalize_latents(z)               # MindSpeed-MM's channel_specified_shift_scale
    video = vae.decode(vae.denormalize_latents(z))   # back to pixels in [-1, 1]

Parameter names are diffusers' state-dict keys (`encoder.down_blocks.0.conv1.weight`, `decoder.up_blocks.0.
upsamplers.0.time_conv.bias`, ...), so a diffusers `vae/` directory loads as downloaded. Equal to diffusers
0.42 within 1e-5 in fp32 (tests/models/test_wan_vae.py), on both frameworks.

How it runs, as diffusers does: every temporal convolution is causal (two frames of zeros in front), and the
video goes through the encoder in chunks (the first frame alone, then 4 frames at a time) and through the
decoder one latent frame at a time; a `CausalCache` carries each causal convolution's last input frames from
one chunk to the next, so memory holds one chunk's activations, not the whole clip's. The 3-D resamplers treat
the first chunk specially (the encoder's temporal downsampling keeps frame 0 as it is, the decoder's temporal
upsampling doubles every latent frame but the first): this is why a clip has 1 + 4k frames.

Not implemented (refused in one line when a config asks): Wan2.2's residual VAE (`is_residual`, `patch_size`),
attention in the encoder's down blocks (`attn_scales`, which diffusers' own encoder cannot run either), and
tiling (`enable_tiling`): chunking already bounds the temporal memory. The VAE is for inference here: encode and
decode run without recording gradients.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import numpy as np

from mmrun.backend import autograd, nn, ops, tensors
from mmrun.backend.errors import UsageError
from mmrun.checkpoint.formats import hf_directory

WHAT = "the Wan VAE (AutoencoderKLWan)"
CLASS_NAME = "AutoencoderKLWan"
CACHE_T = 2  # frames a kernel-3 causal convolution needs from the chunk before
TEMPORAL_CHUNK = 4  # frames per encoder chunk after the first (diffusers' _encode)
LOGVAR_RANGE = (-30.0, 20.0)  # diffusers' DiagonalGaussianDistribution clamps logvar to this
# Wan2.1's statistics of its latents (diffusers' defaults; every published vae/config.json has them).
WAN21_LATENTS_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                      0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_LATENTS_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)


@dataclasses.dataclass(frozen=True)
class WanVAEConfig:
    """diffusers' AutoencoderKLWan constructor arguments (its config.json keys), with its defaults."""

    base_dim: int = 96
    decoder_base_dim: int | None = None
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = ()
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # diffusers' spelling
    dropout: float = 0.0
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD
    is_residual: bool = False
    in_channels: int = 3
    out_channels: int = 3
    patch_size: int | None = None
    scale_factor_temporal: int | None = 4
    scale_factor_spatial: int | None = 8

    def __post_init__(self) -> None:
        refused = {"is_residual": (self.is_residual, False), "patch_size": (self.patch_size, None),
                   "attn_scales": (tuple(self.attn_scales), ())}
        for key, (value, supported) in refused.items():
            if value != supported:
                raise UsageError(f"{WHAT}: config {key}={value!r} (Wan2.2's VAE or encoder attention) is not "
                                 f"supported; mmrun runs the Wan2.1 VAE ({key}={supported!r})")
        if len(self.temperal_downsample) != len(self.dim_mult) - 1:
            raise UsageError(f"{WHAT}: temperal_downsample has {len(self.temperal_downsample)} entries, dim_mult "
                             f"{len(self.dim_mult)}; it needs one per downsampling stage ({len(self.dim_mult) - 1})")
        for key in ("latents_mean", "latents_std"):
            if len(getattr(self, key)) != self.z_dim:
                raise UsageError(f"{WHAT}: config {key} has {len(getattr(self, key))} values for z_dim "
                                 f"{self.z_dim}; it needs one per latent channel")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], where: str = "config") -> "WanVAEConfig":
        """From a diffusers vae/config.json dict (its `_class_name` must be AutoencoderKLWan)."""
        class_name = raw.get("_class_name")
        if class_name != CLASS_NAME:
            raise UsageError(f"{WHAT}: {where} has _class_name {class_name!r}, not {CLASS_NAME!r}; pass the Wan "
                             "Diffusers directory's vae/ folder")
        # Other keys (diffusers' bookkeeping) do not change the network.
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in fields}
        return cls(**values)

    @property
    def temporal_compression(self) -> int:
        return 2 ** sum(bool(flag) for flag in self.temperal_downsample)

    @property
    def spatial_compression(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)


class CausalCache:
    """What each causal convolution (and 3-D resampler) keeps from one chunk of a clip for the next: slot i
    belongs to the i-th such call of a pass, as diffusers' feat_cache list. `start_chunk()` before each chunk."""

    FIRST = "first-chunk"  # the decoder's temporal upsampler saw one chunk: diffusers' "Rep"

    def __init__(self) -> None:
        self._states: list[Any] = []
        self._slot = 0

    def start_chunk(self) -> None:
        self._slot = 0

    def previous(self) -> Any:
        """The state this call site stored in the chunk before (None in the first)."""
        return self._states[self._slot] if self._slot < len(self._states) else None

    def store(self, state: Any) -> None:
        if self._slot == len(self._states):
            self._states.append(None)
        self._states[self._slot] = state
        self._slot += 1


def _last_frames(x, previous):
    """The last CACHE_T input frames so far: this chunk's, completed from the previous state when short."""
    state = x[:, :, -CACHE_T:]
    if state.shape[2] < CACHE_T and previous is not None:
        state = ops.cat([previous[:, :, -1:], state], dim=2)
    return state


class WanCausalConv3d(nn.Conv3d):
    """A Conv3d whose temporal padding is all in front (causal); `padding` (t, h, w) as torch's, the 2*t frames
    of temporal padding replaced by the cached frames of the chunk before where there are some."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride=stride, padding=0)
        pt, ph, pw = (padding,) * 3 if isinstance(padding, int) else tuple(padding)
        self.causal_padding = (pw, pw, ph, ph, 2 * pt, 0)  # ops.pad's order: w, h, t

    def forward(self, x, cache_x=None):
        padding = list(self.causal_padding)
        if cache_x is not None and padding[4] > 0:
            x = ops.cat([cache_x, x], dim=2)
            padding[4] -= cache_x.shape[2]
        if any(padding):
            x = ops.pad(x, padding)
        return ops.conv3d(x, self.weight, self.bias, self.stride, 0)


def _cached(conv: WanCausalConv3d, x, cache: CausalCache | None):
    """conv(x) continuing the clip's earlier chunks (diffusers' feat_cache bookkeeping around each conv)."""
    if cache is None:
        return conv(x)
    previous = cache.previous()
    state = _last_frames(x, previous)
    out = conv(x, previous)
    cache.store(state)
    return out


class WanRMSNorm(nn.Module):
    """diffusers' WanRMS_norm: F.normalize over the channels (dim 1) times sqrt(dim) times `gamma`, shaped
    (dim, 1, 1, 1) for videos or (dim, 1, 1) for images; half precision is normalised in fp32."""

    def __init__(self, dim: int, images: bool = True) -> None:
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(ops.ones((dim,) + ((1, 1) if images else (1, 1, 1))))

    def forward(self, x):
        x32 = x if x.dtype == tensors.float32 else tensors.cast(x, tensors.float32)
        shape = list(x32.shape)
        shape[1] = 1
        # F.normalize: x / max(||x||_2, 1e-12) along dim 1.
        norm = ops.clamp(ops.reshape(ops.sqrt(ops.sum(x32 * x32, dim=1)), shape), min=1e-12)
        normalized = x32 / norm
        if x.dtype != tensors.float32:
            normalized = tensors.cast(normalized, x.dtype)
        return normalized * self.scale * self.gamma


def _frames_as_batch(x):
    """(b, c, t, h, w) -> (b*t, c, h, w)."""
    b, c, t, h, w = x.shape
    return ops.reshape(ops.permute(x, (0, 2, 1, 3, 4)), (b * t, c, h, w))


def _batch_as_frames(x, b: int, t: int):
    """(b*t, c, h, w) -> (b, c, t, h, w)."""
    return ops.permute(ops.reshape(x, (b, t) + tuple(x.shape[1:])), (0, 2, 1, 3, 4))


class _Upsample2x(nn.Module):
    """Nearest upsampling by 2 in h and w (torch's "nearest-exact" at an integer scale: each pixel twice)."""

    def forward(self, x):
        n, c, h, w = x.shape
        doubled = ops.reshape(x, (n, c, h, 1, w, 1)) * ops.ones((1, 1, 1, 2, 1, 2), dtype=x.dtype, like=x)
        return ops.reshape(doubled, (n, c, 2 * h, 2 * w))


class _PadRightBottom(nn.Module):
    """nn.ZeroPad2d((0, 1, 0, 1)) before a stride-2 convolution."""

    def forward(self, x):
        return ops.pad(x, (0, 1, 0, 1))


class WanResample(nn.Module):
    """Spatial up/downsampling by 2 of each frame (`resample`: [pad or upsample, Conv2d], diffusers' Sequential
    indices), and for the 3-D modes a causal temporal convolution (`time_conv`) that halves (downsample3d,
    stride 2) or doubles (upsample3d, 2*dim channels interleaved) the frames after the first chunk."""

    def __init__(self, dim: int, mode: str, upsample_out_dim: int | None = None) -> None:
        super().__init__()
        self.mode = mode
        upsample_out_dim = dim // 2 if upsample_out_dim is None else upsample_out_dim
        if mode.startswith("upsample"):
            self.resample = nn.ModuleList([_Upsample2x(), nn.Conv2d(dim, upsample_out_dim, 3, padding=1)])
        else:
            self.resample = nn.ModuleList([_PadRightBottom(), nn.Conv2d(dim, dim, 3, stride=2)])
        if mode == "upsample3d":
            self.time_conv = WanCausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0))
        elif mode == "downsample3d":
            self.time_conv = WanCausalConv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1), padding=0)
        else:
            self.time_conv = None

    def forward(self, x, cache: CausalCache):
        b, c, t, h, w = x.shape
        if self.mode == "upsample3d":
            x = self._upsample_time(x, cache)
            t = x.shape[2]
        y = _frames_as_batch(x)
        for layer in self.resample:
            y = layer(y)
        x = _batch_as_frames(y, b, t)
        if self.mode == "downsample3d":
            previous = cache.previous()
            if previous is None:  # the first chunk's frame passes as it is
                cache.store(x)
            else:
                cache.store(x[:, :, -1:])
                x = self.time_conv(ops.cat([previous[:, :, -1:], x], dim=2))
        return x

    def _upsample_time(self, x, cache: CausalCache):
        previous = cache.previous()
        if previous is None:  # the first latent frame is not doubled
            cache.store(CausalCache.FIRST)
            return x
        b, c, t, h, w = x.shape
        first = previous is CausalCache.FIRST
        state = x[:, :, -CACHE_T:]
        if state.shape[2] < CACHE_T:
            before = ops.zeros(state.shape, dtype=x.dtype, like=x) if first else previous[:, :, -1:]
            state = ops.cat([before, state], dim=2)
        x = self.time_conv(x) if first else self.time_conv(x, previous)
        cache.store(state)
        # (b, 2c, t) -> (b, c, 2t): the two halves of the channels are frames 2i and 2i+1.
        x = ops.permute(ops.reshape(x, (b, 2, c, t, h, w)), (0, 2, 3, 1, 4, 5))
        return ops.reshape(x, (b, c, 2 * t, h, w))


class WanResidualBlock(nn.Module):
    """norm1 -> silu -> conv1 -> norm2 -> silu -> dropout -> conv2, plus the input (through a 1x1x1
    conv_shortcut when the channels change)."""

    def __init__(self, in_dim: int, out_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.norm1 = WanRMSNorm(in_dim, images=False)
        self.conv1 = WanCausalConv3d(in_dim, out_dim, 3, padding=1)
        self.norm2 = WanRMSNorm(out_dim, images=False)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = WanCausalConv3d(out_dim, out_dim, 3, padding=1)
        self.conv_shortcut = WanCausalConv3d(in_dim, out_dim, 1) if in_dim != out_dim else None

    def forward(self, x, cache: CausalCache | None = None):
        h = x if self.conv_shortcut is None else self.conv_shortcut(x)
        x = _cached(self.conv1, ops.silu(self.norm1(x)), cache)
        x = self.dropout(ops.silu(self.norm2(x)))
        return _cached(self.conv2, x, cache) + h


class WanAttentionBlock(nn.Module):
    """Single-head self-attention over the pixels of each frame (1x1 Conv2d projections), plus the input."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = WanRMSNorm(dim)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x):
        b, c, t, h, w = x.shape
        y = self.to_qkv(self.norm(_frames_as_batch(x)))
        qkv = ops.permute(ops.reshape(y, (b * t, 1, c * 3, h * w)), (0, 1, 3, 2))
        q, k, v = ops.split(qkv, c, dim=3)
        y = ops.scaled_dot_product_attention(q, k, v)  # (b*t, 1, h*w, c)
        y = ops.reshape(ops.permute(ops.reshape(y, (b * t, h * w, c)), (0, 2, 1)), (b * t, c, h, w))
        return _batch_as_frames(self.proj(y), b, t) + x


class WanMidBlock(nn.Module):
    def __init__(self, dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.attentions = nn.ModuleList([WanAttentionBlock(dim)])
        self.resnets = nn.ModuleList([WanResidualBlock(dim, dim, dropout), WanResidualBlock(dim, dim, dropout)])

    def forward(self, x, cache: CausalCache | None = None):
        x = self.resnets[0](x, cache)
        return self.resnets[1](self.attentions[0](x), cache)


class WanEncoder3d(nn.Module):
    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        dims = [config.base_dim * u for u in (1,) + tuple(config.dim_mult)]
        self.conv_in = WanCausalConv3d(config.in_channels, dims[0], 3, padding=1)
        blocks = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(config.num_res_blocks):
                blocks.append(WanResidualBlock(in_dim, out_dim, config.dropout))
                in_dim = out_dim
            if i != len(config.dim_mult) - 1:
                blocks.append(WanResample(out_dim, "downsample3d" if config.temperal_downsample[i] else "downsample2d"))
        self.down_blocks = nn.ModuleList(blocks)
        self.mid_block = WanMidBlock(dims[-1], config.dropout)
        self.norm_out = WanRMSNorm(dims[-1], images=False)
        self.conv_out = WanCausalConv3d(dims[-1], config.z_dim * 2, 3, padding=1)

    def forward(self, x, cache: CausalCache):
        x = _cached(self.conv_in, x, cache)
        for block in self.down_blocks:
            x = block(x, cache)
        x = self.mid_block(x, cache)
        return _cached(self.conv_out, ops.silu(self.norm_out(x)), cache)


class WanUpBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, num_res_blocks: int, dropout: float, upsample_mode: str | None):
        super().__init__()
        self.resnets = nn.ModuleList([WanResidualBlock(in_dim if i == 0 else out_dim, out_dim, dropout)
                                      for i in range(num_res_blocks + 1)])
        self.upsamplers = nn.ModuleList([WanResample(out_dim, upsample_mode)]) if upsample_mode else None

    def forward(self, x, cache: CausalCache):
        for resnet in self.resnets:
            x = resnet(x, cache)
        return x if self.upsamplers is None else self.upsamplers[0](x, cache)


class WanDecoder3d(nn.Module):
    def __init__(self, config: WanVAEConfig) -> None:
        super().__init__()
        base = config.base_dim if config.decoder_base_dim is None else config.decoder_base_dim
        mult = tuple(config.dim_mult)
        dims = [base * u for u in (mult[-1],) + mult[::-1]]
        temperal_upsample = tuple(config.temperal_downsample)[::-1]
        self.conv_in = WanCausalConv3d(config.z_dim, dims[0], 3, padding=1)
        self.mid_block = WanMidBlock(dims[0], config.dropout)
        blocks = []
        for i, (in_dim, out_dim) in enumerate(zip(dims[:-1], dims[1:])):
            in_dim = in_dim // 2 if i > 0 else in_dim  # the upsampler before halved the channels
            mode = None
            if i != len(mult) - 1:
                mode = "upsample3d" if temperal_upsample[i] else "upsample2d"
            blocks.append(WanUpBlock(in_dim, out_dim, config.num_res_blocks, config.dropout, mode))
        self.up_blocks = nn.ModuleList(blocks)
        self.norm_out = WanRMSNorm(dims[-1], images=False)
        self.conv_out = WanCausalConv3d(dims[-1], config.out_channels, 3, padding=1)

    def forward(self, x, cache: CausalCache):
        x = _cached(self.conv_in, x, cache)
        x = self.mid_block(x, cache)
        for block in self.up_blocks:
            x = block(x, cache)
        return _cached(self.conv_out, ops.silu(self.norm_out(x)), cache)


class AutoencoderKLWan(nn.Module):
    """diffusers' AutoencoderKLWan (Wan2.1): `encoder`, `quant_conv`, `post_quant_conv`, `decoder`."""

    def __init__(self, config: WanVAEConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        config = WanVAEConfig(**kwargs) if config is None else config
        self.config = config
        self.encoder = WanEncoder3d(config)
        self.quant_conv = WanCausalConv3d(config.z_dim * 2, config.z_dim * 2, 1)
        self.post_quant_conv = WanCausalConv3d(config.z_dim, config.z_dim, 1)
        self.decoder = WanDecoder3d(config)

    # ------------------------------------------------------------------------------------------ loading

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: str | None = None) -> "AutoencoderKLWan":
        """A diffusers `vae/` directory (config.json + diffusion_pytorch_model.safetensors) as downloaded;
        weights in float32, or `dtype` ("fp16", "bf16", ...) when given."""
        config = WanVAEConfig.from_dict(hf_directory.read_config(path, WHAT), f"{path}/config.json")
        arrays = hf_directory.read_weights(path, WHAT)
        return hf_directory.load_into(cls(config), arrays, WHAT, path, dtype)

    def enable_tiling(self, *args: Any, **kwargs: Any) -> None:
        raise UsageError(f"{WHAT}: tiling (enable_tiling) is not supported by mmrun's Wan VAE; set enable_tiling "
                         "false (encode and decode already go through the clip a few frames at a time)")

    # ------------------------------------------------------------------------------------------ encode

    def encode_moments(self, x):
        """(mean, logvar) of the latent distribution of a video x (b, c, 1+4k, h, w) in [-1, 1]; logvar clamped to
        [-30, 20] as diffusers' DiagonalGaussianDistribution."""
        frames = x.shape[2]
        if frames < 1 or (frames - 1) % TEMPORAL_CHUNK:
            raise UsageError(f"{WHAT}: a clip of {frames} frames; the Wan VAE encodes 1 + {TEMPORAL_CHUNK}k frames "
                             f"(1, 5, 9, ..., 81): pass {1 + (max(frames, 1) - 1) // TEMPORAL_CHUNK * TEMPORAL_CHUNK}")
        factor = self.config.spatial_compression
        if x.shape[3] % factor or x.shape[4] % factor:
            raise UsageError(f"{WHAT}: frames of {x.shape[3]}x{x.shape[4]} pixels; height and width must be multiples "
                             f"of {factor}: resize or crop the clip")
        with autograd.no_grad():
            cache = CausalCache()
            chunks = [x[:, :, :1]] + [x[:, :, i:i + TEMPORAL_CHUNK] for i in range(1, frames, TEMPORAL_CHUNK)]
            outs = []
            for chunk in chunks:
                cache.start_chunk()
                outs.append(self.encoder(chunk, cache))
            moments = self.quant_conv(ops.cat(outs, dim=2) if len(outs) > 1 else outs[0])
            mean, logvar = ops.split(moments, self.config.z_dim, dim=1)
            return mean, ops.clamp(logvar, *LOGVAR_RANGE)

    def encode(self, x, noise=None):
        """Latents of a video x (b, c, 1+4k, h, w) in [-1, 1]: the distribution's mode (its mean), or with `noise`
        (standard normal, the latents' shape) a sample mean + exp(logvar / 2) * noise (MindSpeed-MM's do_sample;
        diffusers' latent_dist.sample() draws that noise itself)."""
        mean, logvar = self.encode_moments(x)
        if noise is None:
            return mean
        with autograd.no_grad():
            return mean + ops.exp(logvar * 0.5) * noise

    # ------------------------------------------------------------------------------------------ decode

    def decode(self, z):
        """Video (b, out_channels, 1 + 4(k-1) frames, 8h, 8w) in [-1, 1] from latents z (b, z_dim, k, h, w) (Wan's
        factors; `config.temporal_compression` and `config.spatial_compression` give a config's own)."""
        with autograd.no_grad():
            x = self.post_quant_conv(z)
            cache = CausalCache()
            outs = []
            for i in range(x.shape[2]):
                cache.start_chunk()
                outs.append(self.decoder(x[:, :, i:i + 1], cache))
            return ops.clamp(ops.cat(outs, dim=2) if len(outs) > 1 else outs[0], -1.0, 1.0)

    # ------------------------------------------------------------------------------------------ latent scale

    def _latent_stats(self, z):
        shape = (1, self.config.z_dim, 1, 1, 1)
        mean = tensors.from_numpy(np.asarray(self.config.latents_mean, np.float32).reshape(shape))
        std = tensors.from_numpy(np.asarray(self.config.latents_std, np.float32).reshape(shape))
        if z.dtype != tensors.float32:
            mean, std = tensors.cast(mean, z.dtype), tensors.cast(std, z.dtype)
        return mean, std

    def normalize_latents(self, z):
        """MindSpeed-MM's channel_specified_shift_scale: (z - latents_mean) / latents_std, per channel."""
        mean, std = self._latent_stats(z)
        return (z - mean) / std

    def denormalize_latents(self, z):
        """The inverse, before decode: z * latents_std + latents_mean (diffusers' WanPipeline)."""
        mean, std = self._latent_stats(z)
        return z * std + mean
