"""Generation speed: mmrun's cached generation (models/vlm/generation.py) against transformers' `generate`,
same weights, same image and prompt, same device, in one process (PyTorch).

    .venv/bin/python benchmarks/vlm_generate.py                      # a small random Qwen2-VL, CPU or the GPU
    .venv/bin/python benchmarks/vlm_generate.py --new-tokens 64 --repeat 5 --hidden 512 --layers 8
    .venv/bin/python benchmarks/vlm_generate.py --model qwen3_vl        # Qwen3-VL (DeepStack, interleaved M-RoPE)

A random Qwen2-VL or Qwen3-VL (transformers' config, this size) is saved once and loaded by both. Each round generates
`--new-tokens` greedy tokens with no EOS (both run the whole length) from the same prompt (text, one image,
text), mmrun and transformers alternating so that machine load hits both alike; the tokens are checked equal.
Reported per side: the median wall time of a round and tokens/s (new tokens / time, prompt included), and
the ratio mmrun tokens/s / transformers tokens/s (above 1: mmrun is faster). Also the time per new token
after the first, from a second round length, to show the cache: a token costs the same at any length.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import numpy as np


def build(model: str, hidden: int, layers: int, vocab: int, path: str) -> None:
    import torch
    import transformers

    heads = max(hidden // 64, 2)
    head_dim = hidden // heads
    ids = dict(image_token_id=vocab - 4, video_token_id=vocab - 3, vision_start_token_id=vocab - 2,
               vision_end_token_id=vocab - 1, tie_word_embeddings=False)
    text = dict(hidden_size=hidden, intermediate_size=hidden * 3, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(heads // 2, 1), vocab_size=vocab, max_position_embeddings=4096)
    if model == "qwen3_vl":
        rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                "mrope_section": [head_dim // 2 - 2 * (head_dim // 6), head_dim // 6, head_dim // 6]}
        config = transformers.Qwen3VLConfig(
            text_config={**text, "head_dim": head_dim, "rope_parameters": rope}, **ids,
            vision_config=dict(depth=2, hidden_size=128, intermediate_size=256, num_heads=4, out_hidden_size=hidden,
                               patch_size=16, num_position_embeddings=64, deepstack_visual_indexes=[0, 1],
                               spatial_merge_size=2, temporal_patch_size=2))
    else:
        config = transformers.Qwen2VLConfig(
            **text, **ids, eos_token_id=None, bos_token_id=None,
            rope_scaling={"type": "mrope", "mrope_section": [head_dim // 4, head_dim // 8, head_dim // 8]},
            vision_config=dict(depth=2, embed_dim=128, hidden_size=hidden, mlp_ratio=2, num_heads=4, patch_size=14,
                               spatial_merge_size=2, temporal_patch_size=2))
    torch.manual_seed(0)
    getattr(transformers, MODELS[model][0])(config).save_pretrained(path)


def prompt(vocab: int, patch_dim: int, grid=(1, 8, 8), text: int = 64):
    rng = np.random.default_rng(0)
    image, start, end = vocab - 4, vocab - 2, vocab - 1
    ids = (rng.integers(0, vocab - 8, text // 2).tolist() + [start] + [image] * (int(np.prod(grid)) // 4) + [end]
           + rng.integers(0, vocab - 8, text // 2).tolist())
    pixels = rng.standard_normal((int(np.prod(grid)), patch_dim)).astype(np.float32)
    return np.asarray([ids], np.int64), pixels, np.asarray([grid], np.int64), image


# --model -> (transformers' class, mmrun's package with from_pretrained, values per patch)
MODELS = {
    "qwen2_vl": ("Qwen2VLForConditionalGeneration", "mmrun.models.qwen2_vl", 1176),
    "qwen3_vl": ("Qwen3VLForConditionalGeneration", "mmrun.models.qwen3_vl", 1536),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2_vl")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a shared machine each parallel region of a small "
                             "op can wait milliseconds for its second thread, which drowns the comparison)")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)

    from mmrun import backend
    import importlib

    from mmrun.models.vlm.generation import GenerationConfig, Generator, Prompt

    backend.select("pytorch", "benchmarks/vlm_generate.py")
    device = backend.current().device_kind
    directory = tempfile.mkdtemp(prefix="vlm_generate_")
    build(args.model, args.hidden, args.layers, args.vocab, directory)
    import transformers

    cls, package, patch_dim = MODELS[args.model]
    theirs = getattr(transformers, cls).from_pretrained(directory).eval()
    theirs.to(backend.load().device.default_device())
    ours = importlib.import_module(package).from_pretrained(directory)
    ours.eval()
    ids, pixels, grid, image = prompt(args.vocab, patch_dim)
    where = backend.load().device.default_device()
    hf_inputs = {"input_ids": torch.from_numpy(ids).to(where), "attention_mask": torch.ones(ids.shape, dtype=torch.long,
                                                                                             device=where),
                 "pixel_values": torch.from_numpy(pixels).to(where), "image_grid_thw": torch.from_numpy(grid).to(where),
                 "mm_token_type_ids": torch.from_numpy(np.where(ids == image, 1, 0)).to(where)}
    generator = Generator(ours)

    def run_ours(n: int) -> list[int]:
        return generator.generate(Prompt(ids, pixels, grid), GenerationConfig(max_new_tokens=n))

    def run_theirs(n: int) -> list[int]:
        with torch.no_grad():
            out = theirs.generate(**hf_inputs, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out[0, ids.shape[1]:].tolist()

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    sides = {"mmrun": run_ours, "transformers": run_theirs}
    for run in sides.values():  # warm-up (kernels, allocator)
        run(4)
    times: dict[str, dict[int, list[float]]] = {name: {args.new_tokens: [], 2 * args.new_tokens: []} for name in sides}
    tokens = {}
    for _ in range(args.repeat):
        for n in (args.new_tokens, 2 * args.new_tokens):
            for name, run in sides.items():
                sync()
                start = time.perf_counter()
                tokens[name, n] = run(n)
                sync()
                times[name][n].append(time.perf_counter() - start)
    same = all(tokens["mmrun", n] == tokens["transformers", n] for n in (args.new_tokens, 2 * args.new_tokens))
    print(f"device {device} ({torch.get_num_threads()} CPU thread(s)), torch {torch.__version__}, "
          f"transformers {transformers.__version__}; {args.model} hidden "
          f"{args.hidden}, {args.layers} layers, vocab {args.vocab}; prompt {ids.shape[1]} tokens (one image of "
          f"{int(np.prod(grid)) // 4} tokens); {args.repeat} rounds, alternating; greedy tokens equal: {same}")
    rates = {}
    for name in sides:
        n = args.new_tokens
        short, long_ = statistics.median(times[name][n]), statistics.median(times[name][2 * n])
        rates[name] = n / short
        print(f"{name:13s} {n} tokens: median {short:.3f} s ({n / short:.1f} tokens/s); per token past the first "
              f"{n}: {(long_ - short) / n * 1e3:.2f} ms")
    print(f"ratio mmrun / transformers tokens/s: {rates['mmrun'] / rates['transformers']:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
