"""data/video: decoding MP4 / GIF / frame folders, MindSpeed-MM's frame sampling and transforms, bad inputs."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from mmrun.data.video import annotations, preprocess, readers, writer
from mmrun.data.video.readers import VideoDataError


def moving_square(frames: int = 9, height: int = 30, width: int = 34) -> np.ndarray:
    clip = np.zeros((frames, height, width, 3), np.uint8)
    for t in range(frames):
        clip[t, 8:18, 2 + 2 * t:12 + 2 * t] = (255, 40, 0)
    return clip


def test_mp4_gif_and_frame_folder_read_back_what_was_written(tmp_path):
    clip = moving_square()
    mp4 = writer.write_video(tmp_path / "a.mp4", clip, fps=8)
    gif = writer.write_video(tmp_path / "b.gif", clip, fps=8)
    folder = tmp_path / "frames"
    folder.mkdir()
    for t, frame in enumerate(clip):
        Image.fromarray(frame).save(folder / f"{t:03d}.png")
    video = readers.read_video(mp4)
    assert video.frames.shape == clip.shape and video.fps == 8
    # H.264 (crf 18, yuv420p: chroma shared by 2x2 pixels) is lossy: close, not exact
    error = np.abs(video.frames.astype(int) - clip)
    assert error.mean() < 3 and np.median(error) <= 2
    assert np.array_equal(readers.read_video(gif).frames, clip)  # palette holds the three colours exactly
    assert np.array_equal(readers.read_video(folder).frames, clip)
    assert not list(tmp_path.glob(".*mmrun-tmp*"))  # the atomic writer left no temporary


def test_undecodable_and_missing_videos_are_one_line_naming_the_file(tmp_path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all" * 10)
    for path, words in ((broken, "will not decode"), (tmp_path / "gone.mp4", "no such video"),
                        (tmp_path / "bad.gif", "will not decode")):
        if path.suffix == ".gif":
            path.write_bytes(b"GIF89a garbage")
        with pytest.raises(VideoDataError, match=words) as caught:
            readers.read_video(path)
        assert str(path) in str(caught.value) and "\n" not in str(caught.value)
    assert broken.read_bytes() == b"not a video at all" * 10  # the user's file is left as it was


def test_frame_sampling_follows_mindspeed_mm():
    params = preprocess.PreprocessParameters(num_frames=9, min_num_frames=1, auto_interval=False)
    rng = np.random.default_rng(0)
    picked = preprocess.sample_frame_indices(30, 24, params, rng)
    # a random window of num_frames * frame_interval, cut to 4k+1
    assert len(picked) == 9 and np.array_equal(np.diff(picked), np.ones(8))
    # auto_interval: 48 fps read at train_fps 24 takes every second frame
    auto = preprocess.PreprocessParameters(num_frames=5, min_num_frames=1, train_fps=24)
    assert np.array_equal(preprocess.sample_frame_indices(9, 48, auto, rng), [0, 2, 4, 6, 8])
    # 11 frames at num_frames 10 -> window 10 -> 4k+1 = 9
    ten = preprocess.PreprocessParameters(num_frames=10, min_num_frames=1, auto_interval=False)
    assert len(preprocess.sample_frame_indices(11, 24, ten, rng)) == 9
    with pytest.raises(VideoDataError, match="clip.mp4: 6 frames give 6 .* fewer than num_frames 9"):
        preprocess.sample_frame_indices(6, 24, params, rng, "clip.mp4")


def mindspeed_pipeline_in_torch(clip: np.ndarray, height: int, width: int) -> np.ndarray:
    """MindSpeed-MM's Wan transforms (data.json's train_pipeline) with its own torch calls."""
    import torch
    import torch.nn.functional as F

    video = torch.from_numpy(clip).permute(0, 3, 1, 2)
    h, w = video.shape[-2:]  # ResizeVideo shortside, bilinear, antialias
    size = (height, int(height / h * w)) if h / w < height / width else (int(width / w * h), width)
    video = F.interpolate(video, size=size, mode="bilinear", align_corners=False, antialias=True)
    video = video.float() / 255.0  # ToTensorVideo
    h, w = video.shape[-2:]  # CenterCropResizeVideo
    new_h, new_w = (int(w * height / width), w) if h / w > height / width else (h, int(h / (height / width)))
    top, left = int(round((h - new_h) / 2.0)), int(round((w - new_w) / 2.0))
    video = F.interpolate(video[..., top:top + new_h, left:left + new_w], size=(height, width), mode="bilinear",
                          align_corners=False, antialias=True)
    return ((video - 0.5) / 0.5).permute(1, 0, 2, 3).numpy()  # norm_fun, then C T H W


def test_preprocess_equals_mindspeed_mm_transforms():
    data_json = {
        "num_frames": 5, "min_num_frames": 1, "frame_interval": 1, "auto_interval": False,
        "max_height": 16, "max_width": 24, "hw_stride": 8, "video_reader_type": "DecordVideo",
        "train_pipeline": {
            "video_and_first_frame": [
                {"trans_type": "ResizeVideo", "param": {"transform_size": "auto", "interpolation_mode": "bilinear",
                                                        "antialias": True, "mode": "shortside"}},
                {"trans_type": "ToTensorVideo"}],
            "video_only": [
                {"trans_type": "CenterCropResizeVideo", "param": {"use_short_edge": False, "top_crop": False,
                                                                  "align_corners": False, "antialias": True,
                                                                  "transform_size": "auto"}},
                {"trans_type": "norm_fun", "param": {"mean": 0.5, "std": 0.5}}]},
    }
    params = preprocess.PreprocessParameters.from_dict(data_json)
    clip = np.random.default_rng(1).integers(0, 256, (5, 37, 41, 3), dtype=np.uint8)
    out = preprocess.preprocess_video(readers.Video(clip, 24.0, "x.mp4"), params, np.random.default_rng(0))
    expected = mindspeed_pipeline_in_torch(clip, 16, 24)
    assert out["video"].shape == (3, 5, 16, 24) and out["video"].dtype == np.float32
    # torch resizes uint8 in fixed point, Pillow in float: on random noise some pixels round one level apart
    # (2/255 after norm_fun); nothing differs by more
    error = np.abs(out["video"] - expected)
    assert error.max() <= 2 / 255 + 1e-6 and (error > 1e-6).mean() < 0.25
    with pytest.raises(VideoDataError, match="trans_type 'Jitter'"):
        preprocess.run_pipeline(clip, [{"trans_type": "Jitter"}], params.transform_size())


def test_resize_equals_torch_interpolate():
    import torch
    import torch.nn.functional as F

    x = np.random.default_rng(2).random((2, 3, 37, 50)).astype(np.float32)
    for size, mode, antialias in (((20, 27), "bilinear", True), ((20, 27), "bilinear", False),
                                  ((60, 81), "bilinear", False), ((20, 27), "bicubic", True)):
        expected = F.interpolate(torch.from_numpy(x), size=size, mode=mode, antialias=antialias).numpy()
        assert np.abs(preprocess.resize(x, size, mode, False, antialias) - expected).max() < 1e-5


# MindSpeed-MM's examples/wan2.1/feature_extract/data.json (Ascend/MindSpeed-MM, Apache-2.0, commit
# 57069cd55a8ab16d5affe379a2e2c5f0a4d962b9): train_pipeline.first_frame_clip as written (i2v's CLIP input).
REAL_FIRST_FRAME_CLIP = [
    {"trans_type": "ResizeVideo", "param": {"transform_size": {"max_height": 224, "max_width": 224},
                                            "mode": "resize", "interpolation_mode": "bicubic",
                                            "align_corners": False, "antialias": False}},
    {"trans_type": "norm_fun", "param": {"mean": [0.48145466, 0.4578275, 0.40821073],
                                         "std": [0.26862954, 0.26130258, 0.27577711]}}]


def test_plain_bicubic_equals_torch_interpolate_and_the_real_first_frame_clip_runs():
    """interpolate(mode="bicubic", antialias=False), up and down, both align_corners, within 3e-5 (measured
    2.6e-5 at most: float32 sums in another order); the real i2v data.json's first_frame_clip list on a frame after
    ToTensorVideo equals torch's interpolate then the normalisation."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(4)
    for shape, size in (((2, 3, 37, 53), (224, 224)), ((1, 3, 300, 260), (224, 224)), ((1, 3, 20, 20), (7, 31))):
        x = rng.random(shape).astype(np.float32)
        for align_corners in (False, True):
            expected = F.interpolate(torch.from_numpy(x), size=size, mode="bicubic", align_corners=align_corners,
                                     antialias=False).numpy()
            assert np.abs(preprocess.resize(x, size, "bicubic", align_corners, False) - expected).max() < 3e-5
    frame = (rng.random((1, 3, 90, 160)) * 255).astype(np.uint8)
    after_to_tensor = preprocess.run_pipeline(frame, [{"trans_type": "ToTensorVideo"}], {})
    out = preprocess.run_pipeline(after_to_tensor, REAL_FIRST_FRAME_CLIP, {})
    resized = F.interpolate(torch.from_numpy(frame).float() / 255, size=(224, 224), mode="bicubic",
                            align_corners=False, antialias=False)
    param = REAL_FIRST_FRAME_CLIP[1]["param"]
    expected = (resized - torch.tensor(param["mean"]).view(1, 3, 1, 1)) / torch.tensor(param["std"]).view(1, 3, 1, 1)
    assert out.shape == (1, 3, 224, 224) and out.dtype == np.float32
    assert np.abs(out - expected.numpy()).max() < 1e-4
    with pytest.raises(VideoDataError, match="on uint8 frames: .* put ToTensorVideo before this step"):
        preprocess.run_pipeline(frame, REAL_FIRST_FRAME_CLIP, {})


def test_data_txt_joins_folders_and_names_bad_lines(tmp_path):
    (tmp_path / "anno.json").write_text(json.dumps([{"path": "a.mp4", "cap": "a red square moves right"},
                                                    {"path": "sub/b.gif", "cap": ["one", "two"], "fps": 8}]))
    (tmp_path / "data.txt").write_text(f"{tmp_path}/videos,{tmp_path}/anno.json\n\n")
    samples = annotations.read_data_txt(tmp_path / "data.txt")
    assert [s["path"] for s in samples] == [f"{tmp_path}/videos/a.mp4", f"{tmp_path}/videos/sub/b.gif"]
    assert samples[1]["fps"] == 8 and annotations.caption_of(samples[1], np.random.default_rng(0)) in ("one", "two")
    (tmp_path / "bad.txt").write_text("just-a-folder\n")
    with pytest.raises(VideoDataError, match=r"bad.txt:1: a line is `<video folder>,<annotation json>`"):
        annotations.read_data_txt(tmp_path / "bad.txt")
    (tmp_path / "anno2.json").write_text(json.dumps([{"cap": "no path"}]))
    with pytest.raises(VideoDataError, match="entry 0 needs \"path\""):
        annotations.read_annotation(tmp_path / "anno2.json", tmp_path)


def test_without_pyav_mp4_falls_back_to_gif_and_reading_names_the_extra(tmp_path):
    code = (
        "import sys, numpy as np; sys.modules['av'] = None\n"
        "from mmrun.data.video import writer, readers\n"
        "print(writer.write_video(sys.argv[1] + '/c.mp4', np.zeros((2, 4, 4, 3), np.uint8) + "
        "np.arange(2, dtype=np.uint8)[:, None, None, None], 4).name)\n"
        "open(sys.argv[1] + '/d.mp4', 'wb').write(b'x')\n"
        "try: readers.read_video(sys.argv[1] + '/d.mp4')\n"
        "except readers.VideoDataError as e: print(e)\n"
        "print(sorted(m for m in ('torch', 'mindspore', 'av', 'imageio') if sys.modules.get(m)))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0] == "c.gif" and "mmrun[video]" in lines[1] and lines[2] == "[]"
