"""inference_vlm.py with Qwen2.5-Omni's thinker: a json with the tiny Omni model.json's sections (scripts/qwen2_5omni,
MindSpeed-MM's model_7b.json shrunk) answers from text + image + audio file, and from a video file with its own
sound track (use_audio_in_video); its greedy tokens equal transformers' thinker `generate` on the same inputs, from
the Hugging Face directory and from `mmrun convert`'s TP=2 split of it."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 6


def _job_module():
    spec = importlib.util.spec_from_file_location("mmrun_tests_omni_job", ROOT / "training" / "omni_job.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(transformers' thinker, the model directory it is saved in with the job's tokenizer and processor, media)."""
    pytest.importorskip("av")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from PIL import Image

    from mmrun.models.qwen2_5_omni import model_json

    root = tmp_path_factory.mktemp("omni_inference")
    job = _job_module()
    paths = job.make_job(root, samples=1)
    raw = json.loads(paths["model_json"].read_text())
    spec = model_json.parse_model_json(raw, str(paths["model_json"]))
    torch.manual_seed(0)
    thinker = transformers.Qwen2_5OmniThinkerForConditionalGeneration(
        transformers.Qwen2_5OmniThinkerConfig(**spec.hf_config))
    with torch.no_grad():
        for param in thinker.parameters():
            param.add_(0.05 * torch.randn_like(param))  # norms and biases random too
    thinker.eval().save_pretrained(paths["model_dir"])
    media = {"image": root / "picture.png", "audio": root / "data" / "audio" / "0.wav", "video": root / "clip.mp4"}
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(media["image"])
    job.write_video_with_sound(media["video"], seconds=2.5)
    inference = {k: v for k, v in raw.items() if k != "model_id"}
    inference.update(pipeline_class="Qwen2VlPipeline", tokenizer={"from_pretrained": str(paths["model_dir"])},
                     generation_config={"max_new_tokens": NEW_TOKENS, "do_sample": False}, prompts="Which tone?",
                     dtype="fp32")
    return thinker, paths["model_dir"], media, inference, root


def _hf_tokens(thinker, prompt) -> list[int]:
    import torch

    names = {"second_per_grid_ts": "video_second_per_grid"}
    inputs = {names.get(k, k): torch.from_numpy(np.asarray(v)) for k, v in vars(prompt).items()
              if isinstance(v, np.ndarray)}
    out = thinker.generate(**inputs, attention_mask=torch.ones_like(inputs["input_ids"]), max_new_tokens=NEW_TOKENS,
                           do_sample=False, use_audio_in_video=prompt.use_audio_in_video)
    return out[0, prompt.input_ids.shape[1]:].tolist()


def _check(pipeline, thinker, text, images=(), videos=(), audios=()) -> list[int]:
    prompt = pipeline.prompt(text, list(images), list(videos), list(audios))
    tokens, _, length = pipeline.answer(text, list(images), None, list(videos), list(audios))
    expected = _hf_tokens(thinker, prompt)
    assert length == prompt.input_ids.shape[1]
    # ours stops at the template's end of turn (transformers' bare thinker has no eos): the same tokens until then
    assert tokens == expected[:len(tokens)] and (len(tokens) == NEW_TOKENS or tokens[-1] in pipeline.generation.eos_token_id)
    return tokens


def test_omni_answers_like_transformers_thinker_generate(setup, tmp_path):
    from mmrun.checkpoint.convert_cli import main as convert
    from mmrun.data.multimodal.vlm_prompt import open_image
    from mmrun.models.inference_vlm import Qwen2VlPipeline

    thinker, model_dir, media, inference, _ = setup
    picture = open_image(str(media["image"]), "image")
    pipeline = Qwen2VlPipeline(inference, "omni_inference.json", None, seed=0, quiet=True)
    tokens = _check(pipeline, thinker, "What do you hear and see?", images=[picture], audios=[media["audio"]])
    prompt = pipeline.prompt("x", [picture], [], [media["audio"]])
    assert prompt.input_features.shape[:2] == (1, 16) and prompt.feature_attention_mask.sum() == 50  # 0.5 s
    assert prompt.image_grid_thw.tolist() == [[1, 4, 6]]

    with_sound = Qwen2VlPipeline({**inference, "use_audio_in_video": True}, "omni_inference.json", None, seed=0,
                                 quiet=True)
    _check(with_sound, thinker, "What happens?", videos=[media["video"]])
    prompt = with_sound.prompt("x", [], [media["video"]])
    assert prompt.video_grid_thw.tolist() == [[3, 4, 4]] and prompt.second_per_grid_ts.tolist() == [1.0]  # 5 frames
    ids = prompt.input_ids[0].tolist()  # video and sound interleaved in one block
    assert ids[ids.index(151652) + 1] == 151647 and prompt.use_audio_in_video

    # the same answer from `mmrun convert`'s tensor-parallel split of the directory (--load takes any split)
    assert convert(["Qwen2_5_OmniConverter", "hf_to_mm", "--cfg.mm_dir", str(tmp_path / "mm"),
                    "--cfg.hf_config.hf_dir", str(model_dir), "--cfg.parallel_config.tp_size", "2"]) == 0
    split = Qwen2VlPipeline(inference, "omni_inference.json", str(tmp_path / "mm"), seed=0, quiet=True)
    assert split.answer("What do you hear and see?", [picture], None, [], [media["audio"]])[0] == tokens


def test_the_command_line_answers_and_refuses_bad_input_in_one_line(setup, capsys):
    from mmrun.models.inference_vlm import main

    _, _, media, inference, root = setup
    path = root / "omni_inference.json"
    path.write_text(json.dumps({**inference, "audio_path": str(media["audio"]), "image_path": str(media["image"])}))
    assert main(["--mm-model", str(path)]) == 0
    captured = capsys.readouterr()
    assert "> " in captured.err and "new tokens after a prompt of" in captured.err
    silent = root / "silent.mp4"
    _job_module().write_video_with_sound(silent, seconds=1.0, hertz=None)
    broken = root / "broken.wav"
    broken.write_bytes(b"RIFF....WAVEfmt garbage")
    for change, words in (({"audio_path": str(broken)}, "broken.wav will not decode as audio"),
                          ({"video_path": str(silent), "use_audio_in_video": True}, "silent.mp4 has no audio track"),
                          ({"audio_path": str(media["audio"]), "video_path": str(media["video"]),
                            "use_audio_in_video": True}, "use_audio_in_video reads each video's own sound track")):
        path.write_text(json.dumps({**inference, **change}))
        with pytest.raises(SystemExit) as exit_:
            main(["--mm-model", str(path)])
        err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("notice: ")]
        assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
