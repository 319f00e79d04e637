"""Does the demo's sampled video show what its prompt says? For each prompt of OUT_DIR/prompts.txt and its video
OUT_DIR/samples/video_<i>.*, find the pixels of the prompted colour in every frame and follow their centroid:
the prompt is met when the colour is there in every frame and its centroid moves the prompted way, by at least a
quarter of the frame along the prompted axis and more than across it.

    python scripts/wan/check_samples.py OUT_DIR [--sheet frames.png]

Prints one line per prompt and exits 1 when a prompt is not met. --sheet writes the videos frame by frame, one
row each (4x enlarged), with a training clip of the demo below them, as a PNG.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo import BACKGROUND, COLOURS, DIRECTIONS  # noqa: E402  (scripts/wan/ is not a package)

MIN_PIXELS = 4.0  # the colour's weight a frame must hold to count as showing it (an 11-pixel shape holds ~100)
MIN_TRAVEL = 0.25  # of the frame's size, along the prompted axis, first frame to last


def colour_weight(frames: np.ndarray, colour: str) -> np.ndarray:
    """(T, H, W) in [0, 1]: 1 at the prompted colour, falling to 0 at the grey background's distance from it
    (a pixel half-way between counts 0.5; another demo colour counts 0)."""
    target = np.asarray(COLOURS[colour], np.float32)
    reach = np.linalg.norm(target - BACKGROUND)
    distance = np.linalg.norm(frames.astype(np.float32) - target, axis=-1)
    return np.clip(1.0 - distance / reach, 0.0, 1.0)


def track(frames: np.ndarray, colour: str) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: the colour's weight (pixels) and its centroid (y, x); NaN where the weight is below MIN_PIXELS."""
    weight = colour_weight(frames, colour)
    total = weight.sum(axis=(1, 2))
    yy, xx = np.mgrid[:frames.shape[1], :frames.shape[2]]
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = np.stack([(weight * yy).sum(axis=(1, 2)) / total, (weight * xx).sum(axis=(1, 2)) / total], axis=1)
    centre[total < MIN_PIXELS] = np.nan
    return total, centre


def check(frames: np.ndarray, prompt: str) -> tuple[bool, str]:
    """Whether uint8 frames (T, H, W, 3) show `prompt` ("a <colour> <shape> moves <direction>"), and why."""
    words = prompt.split()
    colour, direction = words[1], words[-1]
    total, centre = track(frames, colour)
    if np.isnan(centre).any():
        return False, f"{colour} missing in frames {np.flatnonzero(np.isnan(centre[:, 0])).tolist()}"
    step = np.asarray(DIRECTIONS[direction], np.float32)
    moved = centre[-1] - centre[0]
    along, across = float(moved @ step), float(abs(moved @ step[::-1]))
    size = frames.shape[1 if step[0] else 2]
    path = " -> ".join(f"({y:.0f},{x:.0f})" for y, x in centre[::max(len(centre) // 4, 1)])
    why = (f"{colour} in every frame ({total.min():.0f}-{total.max():.0f} px), centroid (y,x) {path}: "
           f"{along:+.1f} px {direction}, {across:.1f} px across")
    return along >= MIN_TRAVEL * size and along > across, why


def sheet(rows: list[np.ndarray], path: Path, scale: int = 4) -> None:
    """Each (T, H, W, 3) video a row of its frames, enlarged `scale` times, as one PNG."""
    import io

    from PIL import Image

    from mmrun.common.atomic_write import atomic_write

    width = max(r.shape[0] * r.shape[2] for r in rows)
    image = np.full((sum(r.shape[1] for r in rows), width, 3), 255, np.uint8)
    top = 0
    for row in rows:
        strip = np.concatenate(list(row), axis=1)
        image[top:top + strip.shape[0], :strip.shape[1]] = strip
        top += strip.shape[0]
    big = image.repeat(scale, axis=0).repeat(scale, axis=1)
    buffer = io.BytesIO()
    Image.fromarray(big).save(buffer, format="PNG")
    atomic_write(path, buffer.getvalue())


def main(argv: list[str] | None = None) -> int:
    from mmrun.data.video import readers

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--sheet", help="write the sampled videos (and a training clip) frame by frame to this PNG")
    args = parser.parse_args(argv)
    out = Path(args.out_dir)
    prompts_file = out / "prompts.txt"
    if not prompts_file.is_file():
        print(f"error: {prompts_file} not found: pass the OUT_DIR scripts/pretrain_wan.sh wrote", file=sys.stderr)
        return 2
    prompts = [line.strip() for line in prompts_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    videos, met = [], 0
    for i, prompt in enumerate(prompts):
        found = sorted((out / "samples").glob(f"video_{i}.*"))
        if not found:
            print(f"error: no {out / 'samples'}/video_{i}.* for prompt {prompt!r}: run the sampling step first",
                  file=sys.stderr)
            return 2
        frames = readers.read_video(found[0]).frames
        ok, why = check(frames, prompt)
        met += ok
        videos.append(frames)
        print(f"{'ok  ' if ok else 'MISS'} {found[0].name} {prompt!r}: {why}")
    print(f"{met}/{len(prompts)} sampled videos show their prompt's colour moving its way")
    if args.sheet:
        clips = sorted((out / "videos").glob("clip_*"))
        rows = videos + [readers.read_video(clips[0]).frames] if clips else videos
        sheet(rows, Path(args.sheet))
        print(f"wrote {args.sheet}")
    return 0 if met == len(prompts) else 1


if __name__ == "__main__":
    sys.exit(main())
