"""Audio files (or a video's own audio track) to mono float32 waveforms at the feature extractor's rate, through
PyAV (the optional decoder data/video/readers.py uses).

MindSpeed-MM reads audio with librosa.load(path, sr=16000), whose resampler is soxr's; here ffmpeg's (libswresample)
resamples a file whose rate differs, so such a file's samples differ from MindSpeed-MM's in the last bits (a
16 kHz file is decoded as it is). A file that will not decode, or a video without an audio track, is a one-line
AudioInputError (exit 2).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mmrun.data.audio.features import AudioInputError
from mmrun.data.video.readers import import_av


def read_audio(path: str | os.PathLike, sampling_rate: int = 16000, what: str = "audio") -> np.ndarray:
    """The first audio stream of `path` mixed to mono, at `sampling_rate` Hz, float32. `what` names the file in
    errors ("audio", or "video" when the track of a video is read for use_audio_in_video)."""
    path = Path(path)
    if not path.is_file():
        raise AudioInputError(f"{what} file {path} does not exist; fix the path in the dataset")
    av = import_av()
    try:
        with av.open(str(path)) as container:
            if not container.streams.audio:
                hint = (" (use_audio_in_video reads each video's sound: give videos with sound, or set "
                        "use_audio_in_video false)" if what == "video" else "")
                raise AudioInputError(f"{what} file {path} has no audio track{hint}")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=sampling_rate)
            pieces = []
            for frame in container.decode(stream):
                pieces.extend(r.to_ndarray().reshape(-1) for r in resampler.resample(frame))
            pieces.extend(r.to_ndarray().reshape(-1) for r in resampler.resample(None))
    except (av.FFmpegError, ValueError, OSError) as error:
        raise AudioInputError(f"{what} file {path} will not decode as audio ({type(error).__name__}: "
                              f"{str(error).splitlines()[0] if str(error) else 'no detail'}); replace the file") from None
    if not pieces:
        raise AudioInputError(f"{what} file {path} will not decode as audio (no sample in its audio track); "
                              "replace the file")
    return np.concatenate(pieces).astype(np.float32)
