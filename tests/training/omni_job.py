"""A tiny Qwen2.5-Omni fine-tuning job from MindSpeed-MM's own files (scripts/qwen2_5omni/: Ascend/MindSpeed-MM's
examples/qwen2.5omni/model_7b.json with its sizes shrunk, every key kept, and data_7b.json as it is) with its paths
pointed at a synthetic dataset: WAV tones with captions, a few with a video (frames) and its sound track.
The tokenizer is a small byte-level BPE with the Omni tokenizer's special tokens at their real ids (151643...).
"""
from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
from PIL import Image

SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|AUDIO|>": 151646,
           "<|audio_bos|>": 151647, "<|audio_eos|>": 151648, "<|vision_bos|>": 151652, "<|vision_eos|>": 151653,
           "<|IMAGE|>": 151655, "<|VIDEO|>": 151656}
TONES = {"low": 220.0, "middle": 440.0, "high": 880.0}

FILES = Path(__file__).resolve().parents[2] / "scripts" / "qwen2_5omni"


def _tokenizer_json(texts: list[str]) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    data = json.loads(tokenizer.to_str())
    data["model"]["vocab"].update(SPECIAL)  # the ids as the Omni tokenizer's (the vocabulary has a gap below them)
    data["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for t, i in SPECIAL.items()]
    return json.dumps(data)


def _wav(path: Path, hertz: float, seconds: float, rate: int = 16000) -> None:
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.4 * np.sin(2 * np.pi * hertz * t) * 32767).astype(np.int16)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(rate)
        f.writeframes(samples.tobytes())


def make_job(root: Path, samples: int = 8, use_audio_in_video: bool = False, files: Path = FILES) -> dict[str, Path]:
    """Write the job's files under `root`: data.json, the model directory, the dataset (model.json: `files`'s)."""
    root.mkdir(parents=True, exist_ok=True)
    data_dir, model_dir = root / "data", root / "model"
    (data_dir / "audio").mkdir(parents=True, exist_ok=True)
    (data_dir / "frames").mkdir(parents=True, exist_ok=True)
    model_dir.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    records = []
    for i in range(samples):
        name = list(TONES)[i % 3]
        audio = f"audio/{i}.wav"
        _wav(data_dir / audio, TONES[name], 0.5 + 0.25 * (i % 4))
        record = {"messages": [{"role": "user", "content": "<audio>Which tone is it?"},
                               {"role": "assistant", "content": f"a {name} tone."}], "audios": [audio]}
        if i % 4 == 3:  # a video (two frames) beside its sound track
            frames = []
            for f in range(2):
                frame = f"frames/{i}_{f}.png"
                Image.fromarray(rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)).save(data_dir / frame)
                frames.append(frame)
            record["videos"] = [frames]
            record["messages"][0]["content"] = "<video><audio>What do you hear?"
        records.append(record)
    (data_dir / "omni.json").write_text(json.dumps(records))
    texts = [m["content"] for r in records for m in r["messages"]] * 4
    texts += ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n", "<|im_start|>assistant\n"]
    (model_dir / "tokenizer.json").write_text(_tokenizer_json(texts))
    preprocessor = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12544,
                    "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
                    "do_resize": True, "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
                    "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 16, "sampling_rate": 16000,
                    "hop_length": 160, "n_fft": 400, "chunk_length": 300, "return_attention_mask": True}
    (model_dir / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    data = json.loads((files / "data_7b.json").read_text())
    data["dataset_param"]["preprocess_parameters"]["model_name_or_path"] = str(model_dir)
    data["dataset_param"]["basic_parameters"].update(dataset_dir=str(data_dir), dataset=str(data_dir / "omni.json"),
                                                     cache_dir=str(root / "cache"))
    if use_audio_in_video:
        data["dataset_param"]["preprocess_parameters"]["use_audio_in_video"] = True
    (root / "data.json").write_text(json.dumps(data, indent=1))
    return {"model_json": files / "model_tiny.json", "data_json": root / "data.json", "model_dir": model_dir,
            "dataset": data_dir / "omni.json"}


def write_video_with_sound(path: Path, seconds: float = 3.0, fps: int = 4, size: int = 56, hertz: float | None = 440.0,
                           rate: int = 16000, seed: int = 0) -> Path:
    """An MP4 (H.264 random frames, and with `hertz` an AAC sine track at `rate` Hz) written through PyAV."""
    import av

    rng = np.random.default_rng(seed)
    with av.open(str(path), "w", format="mp4") as container:
        video = container.add_stream("libx264", rate=fps)
        video.width = video.height = size
        video.pix_fmt = "yuv420p"
        sound = None
        if hertz is not None:
            sound = container.add_stream("aac", rate=rate)
            sound.layout = "mono"
        for _ in range(int(seconds * fps)):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8), format="rgb24")
            for packet in video.encode(frame):
                container.mux(packet)
        for packet in video.encode():
            container.mux(packet)
        if sound is not None:
            wave = (0.4 * np.sin(2 * np.pi * hertz * np.arange(int(seconds * rate)) / rate)).astype(np.float32)
            for start in range(0, wave.size, 1024):
                piece = av.AudioFrame.from_ndarray(wave[None, start:start + 1024], format="fltp", layout="mono")
                piece.sample_rate = rate
                for packet in sound.encode(piece):
                    container.mux(packet)
            for packet in sound.encode():
                container.mux(packet)
    return path
