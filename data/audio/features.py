"""Whisper's log-mel features in numpy: what transformers' WhisperFeatureExtractor gives Qwen2.5-Omni (and
Qwen2-Audio), equal to it (tests/data/test_audio_features.py: within 1e-5 on the frames its attention mask
keeps), without transformers or torch.

The recipe (OpenAI Whisper's): a periodic Hann window of n_fft samples, frames every hop_length samples centred
on each hop (the signal reflected at its start), |FFT|^2, the Slaney-normalised Slaney-scale mel filter bank
(0 to 8 kHz), log10 of max(mel, 1e-10), floored at the audio's maximum - 8, then (x + 4) / 4. The extractor
pads every audio with silence to `chunk_length` seconds before the transform (the processor's padding
"max_length"); frames past the audio are padding the mask drops, so only the frames that touch the audio are
computed here, and the padding's effect on the floor (an all-silent frame is log10(1e-10) = -10) is taken into
account exactly. One audio per call; `features(...)` returns (num_mel_bins, frames) float32 and the mask count.

Bad input is a one-line UsageError: another sampling rate than the extractor's (resample first), more than
`chunk_length` seconds (transformers would cut it silently), an empty or non-mono or non-finite waveform.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from mmrun.backend.errors import UsageError

LOG_FLOOR = -10.0  # log10 of the 1e-10 clamp: an all-silent frame


class AudioInputError(UsageError):
    """An audio the feature extractor cannot take (one line: what was received and what to do)."""


def hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    freq = np.asarray(freq, dtype=np.float64)
    min_log_hertz, min_log_mel, logstep = 1000.0, 15.0, 27.0 / np.log(6.4)
    mels = 3.0 * freq / 200.0
    return np.where(freq >= min_log_hertz, min_log_mel + np.log(np.maximum(freq, min_log_hertz) / min_log_hertz)
                    * logstep, mels)


def mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    min_log_hertz, min_log_mel, logstep = 1000.0, 15.0, np.log(6.4) / 27.0
    freq = 200.0 * mels / 3.0
    return np.where(mels >= min_log_mel, min_log_hertz * np.exp(logstep * (mels - min_log_mel)), freq)


def mel_filters(num_frequency_bins: int, num_mel_bins: int, sampling_rate: int, min_frequency: float = 0.0,
                max_frequency: float = 8000.0) -> np.ndarray:
    """(num_frequency_bins, num_mel_bins) float64 triangular filters on Slaney's mel scale, each scaled to unit
    area (Slaney normalisation): librosa's / transformers' mel_filter_bank(norm="slaney", mel_scale="slaney")."""
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    mel_points = np.linspace(hertz_to_mel(min_frequency), hertz_to_mel(max_frequency), num_mel_bins + 2)
    filter_freqs = mel_to_hertz(mel_points)
    widths = np.diff(filter_freqs)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]  # (bins, num_mel_bins + 2)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    enorm = 2.0 / (filter_freqs[2:num_mel_bins + 2] - filter_freqs[:num_mel_bins])
    return filters * enorm[None, :]


@dataclass(frozen=True)
class WhisperFeatures:
    """The extractor's settings (a preprocessor_config.json's keys; defaults: Qwen2.5-Omni-7B's)."""

    feature_size: int = 128  # mel bins
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 400
    chunk_length: int = 300  # seconds every audio is padded to; the longest audio taken

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "WhisperFeatures":
        return cls(**{k: int(config[k]) for k in ("feature_size", "sampling_rate", "hop_length", "n_fft",
                                                   "chunk_length") if k in config})

    @classmethod
    def from_pretrained(cls, directory: str) -> "WhisperFeatures":
        """From a model directory's preprocessor_config.json (the processor's file)."""
        path = os.path.join(directory, "preprocessor_config.json")
        try:
            with open(path, encoding="utf-8") as f:
                return cls.from_config(json.load(f))
        except (OSError, ValueError) as error:
            raise UsageError(f"cannot read the audio feature settings {path} ({error}); pass the model directory "
                             "with the processor's preprocessor_config.json") from None

    @property
    def max_samples(self) -> int:
        return self.chunk_length * self.sampling_rate

    def filters(self) -> np.ndarray:
        return mel_filters(1 + self.n_fft // 2, self.feature_size, self.sampling_rate)

    def check(self, waveform: Any, sampling_rate: int | None, where: str = "audio") -> np.ndarray:
        """The waveform as float32 mono, or a one-line AudioInputError."""
        if sampling_rate is not None and int(sampling_rate) != self.sampling_rate:
            raise AudioInputError(f"{where}: sampled at {sampling_rate} Hz, but the feature extractor takes "
                                  f"{self.sampling_rate} Hz only; resample it to {self.sampling_rate} Hz first")
        wave = np.asarray(waveform, dtype=np.float32)
        if wave.ndim != 1 or wave.size == 0:
            raise AudioInputError(f"{where}: a waveform of shape {wave.shape}; the feature extractor takes one "
                                  "non-empty mono channel (mix the channels down first)")
        if wave.size > self.max_samples:
            raise AudioInputError(f"{where}: {wave.size / self.sampling_rate:.1f} s long, above the extractor's limit "
                                  f"of {self.chunk_length} s (chunk_length); cut the audio or raise chunk_length")
        if not np.all(np.isfinite(wave)):
            raise AudioInputError(f"{where}: the waveform holds NaN or infinite samples; fix the audio file")
        return wave

    def features(self, waveform: Any, sampling_rate: int | None = None, where: str = "audio"
                 ) -> tuple[np.ndarray, int]:
        """(log-mel (feature_size, frames) float32, frames): the frames the extractor's attention mask keeps,
        ceil(samples / hop_length)."""
        wave = self.check(waveform, sampling_rate, where).astype(np.float64)
        hop, n_fft, half = self.hop_length, self.n_fft, self.n_fft // 2
        kept = math.ceil(wave.size / hop)
        total_frames = self.max_samples // hop  # the padded spectrogram's frames (its last one dropped)
        # Frames that see any audio sample: frame j covers padded samples [j * hop - half, j * hop + half).
        touched = min(total_frames, (wave.size - 1 + half) // hop + 1)
        # The padded audio (silence up to chunk_length seconds) as far as those frames read it, reflected at its
        # start (torch.stft's centre padding) and, when they reach it, at its end.
        end = (touched - 1) * hop + half
        base = np.zeros(min(self.max_samples, max(end, half + 1)), np.float64)
        base[:wave.size] = wave
        signal = np.pad(base, (half, half if end > base.size else 0), mode="reflect")
        window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
        starts = np.arange(touched) * hop
        frames = signal[starts[:, None] + np.arange(n_fft)[None, :]] * window[None, :]
        power = np.abs(np.fft.rfft(frames, n=n_fft, axis=1)) ** 2  # (touched, bins)
        log_spec = np.log10(np.maximum(self.filters().T @ power.T, 1e-10))  # (mels, touched)
        peak = log_spec.max()
        if touched < total_frames:  # silent padding frames are in the extractor's maximum too
            peak = max(peak, LOG_FLOOR)
        log_spec = (np.maximum(log_spec[:, :kept], peak - 8.0) + 4.0) / 4.0
        return log_spec.astype(np.float32), kept

    def batch(self, waveforms: list, sampling_rate: int | None = None) -> dict[str, np.ndarray]:
        """The processor's audio inputs for several audios: input_features (audios, mel, longest) zero beyond
        each audio's frames, feature_attention_mask (audios, longest) int64. (The extractor pads to
        chunk_length seconds; the model reads only the masked frames, so the padding is cut to the longest.)"""
        results = [self.features(w, sampling_rate, where=f"audio {i}") for i, w in enumerate(waveforms)]
        longest = max(kept for _, kept in results)
        features = np.zeros((len(results), self.feature_size, longest), np.float32)
        mask = np.zeros((len(results), longest), np.int64)
        for i, (spec, kept) in enumerate(results):
            features[i, :, :kept], mask[i, :kept] = spec, 1
        return {"input_features": features, "feature_attention_mask": mask}
