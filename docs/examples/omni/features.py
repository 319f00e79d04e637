"""Whisper's log-mel features in numpy (mmrun.data.audio) against transformers' WhisperFeatureExtractor with
Qwen2.5-Omni's settings (128 mel bins, audio padded to 300 s), on 1.3 s of a tone with noise."""
import numpy as np
import transformers

from mmrun.data.audio.features import AudioInputError, WhisperFeatures

rng = np.random.default_rng(0)
wave = (0.3 * np.sin(2 * np.pi * 440 * np.arange(20800) / 16000) + 0.05 * rng.standard_normal(20800)).astype(np.float32)
extractor = transformers.WhisperFeatureExtractor(feature_size=128, chunk_length=300)
out = extractor(wave, sampling_rate=16000, return_attention_mask=True, padding="max_length", return_tensors="np")
theirs = out["input_features"][0][:, out["attention_mask"][0] == 1]
ours, frames = WhisperFeatures().features(wave, 16000)
print(f"frames kept {frames} (transformers {theirs.shape[1]}), mel bins {ours.shape[0]}, "
      f"max |ours - transformers'| < 3e-5: {np.abs(ours - theirs).max() < 3e-5}")
for bad, rate in ((wave, 44100), (np.zeros(16000 * 301, np.float32), 16000)):
    try:
        WhisperFeatures().features(bad, rate)
    except AudioInputError as error:
        print(f"refused: {error}")
