"""Whisper log-mel features in numpy (data/audio/features.py) against transformers' WhisperFeatureExtractor,
and the one-line refusals of audio the extractor cannot take (data/audio/reader.py for files)."""
from __future__ import annotations

import wave

import numpy as np
import pytest

from mmrun.backend.errors import UsageError
from mmrun.data.audio.features import AudioInputError, WhisperFeatures, mel_filters
from mmrun.data.audio.reader import read_audio


def _waveform(samples: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(samples) / 16000
    return (0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(samples)).astype(np.float32)


def _reference(extractor, waveform):
    out = extractor(waveform, sampling_rate=16000, return_attention_mask=True, padding="max_length",
                    return_tensors="np")
    mask = out["attention_mask"][0]
    return out["input_features"][0][:, mask == 1], int(mask.sum())


def test_mel_filters_equal_transformers():
    audio_utils = pytest.importorskip("transformers.audio_utils")
    expected = audio_utils.mel_filter_bank(num_frequency_bins=201, num_mel_filters=128, min_frequency=0.0,
                                           max_frequency=8000.0, sampling_rate=16000, norm="slaney",
                                           mel_scale="slaney")
    np.testing.assert_allclose(mel_filters(201, 128, 16000), expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("chunk_length,samples", [
    (300, 16000),       # Qwen2.5-Omni's extractor: 1 s padded to 300 s
    (30, 1601),         # a part-filled last hop
    (30, 150),          # shorter than half a window: the start's reflection reads the padding
    (1, 16000),         # exactly chunk_length: the end is reflected too, no silent frame in the maximum
])
def test_log_mel_equals_whisper_feature_extractor(chunk_length, samples):
    transformers = pytest.importorskip("transformers")
    extractor = transformers.WhisperFeatureExtractor(feature_size=128, chunk_length=chunk_length)
    waveform = _waveform(samples)
    expected, frames = _reference(extractor, waveform)
    ours, kept = WhisperFeatures(chunk_length=chunk_length).features(waveform, 16000)
    assert kept == frames == -(-samples // 160)
    assert ours.shape == expected.shape and ours.dtype == np.float32
    # The extractor's call runs torch.stft in float32 (measured: 1.2e-5 from ours at most, on a faint bin beside a
    # loud one); its numpy path, the same algorithm in float64 as ours, agrees to float32 rounding.
    np.testing.assert_allclose(ours, expected, rtol=0, atol=3e-5)
    if chunk_length <= 30:  # (its numpy path is slow on 300 s of padding)
        padded = np.zeros(extractor.n_samples, np.float32)
        padded[:samples] = waveform
        numpy_path = extractor._np_extract_fbank_features(padded[None], "cpu")[0][:, :kept]
        np.testing.assert_allclose(ours, numpy_path, rtol=0, atol=1e-6)


def test_batch_pads_to_the_longest_with_the_processor_mask():
    batch = WhisperFeatures(chunk_length=30).batch([_waveform(3200, 1), _waveform(800, 2)], 16000)
    assert batch["input_features"].shape == (2, 128, 20)
    np.testing.assert_array_equal(batch["feature_attention_mask"].sum(1), [20, 5])
    assert np.all(batch["input_features"][1, :, 5:] == 0)


@pytest.mark.parametrize("waveform,rate,message", [
    (np.zeros(4410, np.float32), 44100, r"sampled at 44100 Hz, but the feature extractor takes 16000 Hz only"),
    (np.zeros(16000 * 31, np.float32), 16000, r"31.0 s long, above the extractor's limit of 30 s"),
    (np.zeros((2, 1600), np.float32), 16000, r"one non-empty mono channel"),
    (np.full(1600, np.nan, np.float32), 16000, r"NaN or infinite"),
])
def test_audio_the_extractor_cannot_take_is_a_one_line_usage_error(waveform, rate, message):
    with pytest.raises(AudioInputError, match=message) as error:
        WhisperFeatures(chunk_length=30).features(waveform, rate)
    assert isinstance(error.value, UsageError) and "\n" not in str(error.value)


def test_read_audio_decodes_a_wav_and_refuses_what_will_not_decode(tmp_path):
    pytest.importorskip("av")
    samples = (_waveform(8000) * 32767).astype(np.int16)
    path = tmp_path / "a.wav"
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(16000)
        f.writeframes(samples.tobytes())
    np.testing.assert_allclose(read_audio(path), samples / 32768.0, atol=1e-6)
    assert read_audio(path, sampling_rate=8000).size == 4000  # resampled by ffmpeg

    broken = tmp_path / "broken.wav"
    broken.write_bytes(b"RIFF\x00\x00garbage" * 10)
    for bad, message in ((broken, r"broken.wav will not decode as audio"), (tmp_path / "none.wav", "does not exist")):
        with pytest.raises(AudioInputError, match=message) as error:
            read_audio(bad)
        assert "\n" not in str(error.value)


def test_video_without_sound_is_refused_for_its_audio_track(tmp_path):
    pytest.importorskip("av")
    from mmrun.data.video.writer import write_video

    path = tmp_path / "silent.mp4"
    write_video(path, np.zeros((4, 32, 32, 3), np.uint8), 2.0)
    with pytest.raises(AudioInputError, match=r"silent.mp4 has no audio track \(use_audio_in_video"):
        read_audio(path, what="video")
