"""`mmrun convert` with tensor and pipeline parallelism: HF -> (TP=2, PP=2) -> resplit (TP=1, PP=4) -> HF gives
the original bytes of every tensor; the rank files hold exactly mm_layout's names and shapes; mm-convert's command
lines of the guides parse unchanged; bad input is one line, exit 2, nothing written; memory stays bounded by the
largest tensor, not the model. The models are random numpy weights in real Hugging Face directories (no
framework, no download)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from mmrun.backend import checkpoint_io
from mmrun.checkpoint.convert_cli import main, parse_options
from mmrun.checkpoint import vlm as convert
from mmrun.models.qwen2_vl import hf_checkpoint
from mmrun.models.vlm import mm_layout
from mmrun.training import checkpoint_vlm
from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
from mmrun.checkpoint.formats.safetensors import SafetensorsFile
from mmrun.models.vlm.mm_layout import VLMLayout
from mmrun.training.checkpoint_layout import TRACKER_FILE, rank_dir_name

CONVERTER = {"qwen2_vl": "Qwen2VLConverter", "qwen2_5_vl": "Qwen2_5_VLConverter"}


def _hf_config(tiny, model_type: str, **text: int) -> dict:
    """tests/models/tiny_hf.py's config of `model_type` (the `tiny` fixture) with 4 decoder layers."""
    return {**tiny.TEXT, "num_hidden_layers": 4, **text, **tiny.IDS, "model_type": model_type,
            "tie_word_embeddings": tiny.TIED[model_type], "vision_config": tiny.VISION[model_type]}


def _hf_dir(folder: Path, raw: dict, dtype: str, seed: int = 0) -> Path:
    """A Hugging Face directory of random weights (norms and biases too), saved in `dtype`, plus a tokenizer file."""
    config = Qwen2VLConfig.from_hf_config(raw)
    rng = np.random.default_rng(seed)
    shapes = mm_layout.hf_shapes(config)
    arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    hf_checkpoint.save_hf_directory(folder, config, arrays, dtype=dtype)
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _run(capsys, converter: str, sub: str, **options) -> tuple[int, str, str]:
    argv = [converter, sub]
    for key, value in options.items():
        argv += [f"--cfg.{key}", value if isinstance(value, str) else json.dumps(value)]
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def _tensors(folder: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        st = SafetensorsFile(file)
        found.update({name: (str(st.dtype(name)), st.shape(name), st[name].tobytes()) for name in st})
    return found


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_through_tp2_pp2_and_tp1_pp4_gives_the_original_bytes(model_type, dtype, tiny, tmp_path,
                                                                          capsys):
    raw = _hf_config(tiny, model_type)
    hf = _hf_dir(tmp_path / "hf", raw, dtype)
    conv = CONVERTER[model_type]
    # the seeds' form: one list per virtual chunk, the ViT on stage 0
    code, out, err = _run(capsys, conv, "hf_to_mm", mm_dir=str(tmp_path / "mm"), **{
        "hf_config.hf_dir": str(hf), "parallel_config.llm_pp_layers": [[1, 3]],
        "parallel_config.vit_pp_layers": [[2, 0]], "parallel_config.tp_size": 2})
    assert code == 0, err
    assert (tmp_path / "mm" / TRACKER_FILE).read_text().strip() == "release"
    config = Qwen2VLConfig.from_hf_config(raw)
    layout = VLMLayout.build(config, 2, 2, [2, 0], [1, 3])
    release = tmp_path / "mm" / "release"
    assert sorted(p.name for p in release.iterdir()) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000",
                                                         "mp_rank_01_001"]
    for t in range(2):
        for p in range(2):
            rank = release / rank_dir_name(t, p, 2)
            held = SafetensorsFile(rank / checkpoint_io.MODEL_FILE)
            assert {n: held.shape(n) for n in held} == layout.rank_shapes(t, p)
            assert {str(held.dtype(n)) for n in held} == {"float32"}
            meta = json.loads((rank / checkpoint_io.META_FILE).read_text())
            assert meta["model_names"] == "mindspeed-mm" and meta["parallel"]["tp_rank"] == t
            assert (meta["parallel"]["tp"], meta["parallel"]["pp"], meta["parallel"]["pp_rank"]) == (2, 2, p)
    # megatron-core's tied copy of the word embeddings on the last stage (Qwen2-VL ties them)
    assert ("text_decoder.output_layer.weight" in SafetensorsFile(release / "mp_rank_00_001" / "model.safetensors")) \
        == (not config.tie_word_embeddings or layout.ties_output_copy)
    # the loop's verified reader takes every rank directory (checksums, format)
    from mmrun.training.checkpoint_store import verify_iteration_dir
    verify_iteration_dir(release, "release")

    code, out, err = _run(capsys, conv, "resplit", source_dir=str(tmp_path / "mm"), target_dir=str(tmp_path / "pp4"),
                          **{"source_parallel_config.llm_pp_layers": [1, 3],
                             "source_parallel_config.vit_pp_layers": [2, 0], "source_parallel_config.tp_size": 2,
                             "target_parallel_config.llm_pp_layers": [1, 1, 1, 1],
                             "target_parallel_config.vit_pp_layers": [2, 0, 0, 0],
                             "target_parallel_config.tp_size": 1})
    assert code == 0, err
    assert "resplitting" in out and "tp_size 1, vit_pp_layers [2, 0, 0, 0], llm_pp_layers [1, 1, 1, 1]" in out
    source = checkpoint_vlm.open_checkpoint(tmp_path / "pp4")
    assert (source.layout.tp, source.layout.llm_pp_layers) == (1, (1, 1, 1, 1))

    code, out, err = _run(capsys, conv, "mm_to_hf", save_hf_dir=str(tmp_path / "back"), mm_dir=str(tmp_path / "pp4"),
                          **{"hf_config.hf_dir": str(hf), "parallel_config.llm_pp_layers": [1, 1, 1, 1],
                             "parallel_config.vit_pp_layers": [2, 0, 0, 0], "parallel_config.tp_size": 1})
    assert code == 0, err
    original, back = _tensors(hf), _tensors(tmp_path / "back")
    assert sorted(original) == sorted(back)
    differ = [name for name in original if original[name] != back[name]]
    assert not differ, differ[:3]
    assert (tmp_path / "back" / "tokenizer.json").is_file()
    assert json.loads((tmp_path / "back" / "config.json").read_text())["torch_dtype"] == dtype
    assert not list(tmp_path.glob("**/*.mmrun-tmp-*"))


def test_virtual_pipeline_chunks_convert_resplit_and_come_back_byte_identical(tiny, tmp_path, capsys):
    """MindSpeed-MM's VPP lists (one list per virtual chunk, chunk-major): HF -> (TP=2, PP=2 x VPP=2) with the
    megatron-core engine's model0./model1. names per rank -> resplit (TP=1, PP=2, flat) -> HF, the original bytes."""
    raw = _hf_config(tiny, "qwen2_vl")
    hf = _hf_dir(tmp_path / "hf", raw, "bfloat16")
    vpp_lists = {"parallel_config.vit_pp_layers": [[2, 0], [0, 0]], "parallel_config.llm_pp_layers": [[1, 1], [1, 1]]}
    code, out, err = _run(capsys, "Qwen2VLConverter", "hf_to_mm", mm_dir=str(tmp_path / "mm"),
                          **{"hf_config.hf_dir": str(hf), "parallel_config.tp_size": 2, **vpp_lists})
    assert code == 0, err
    layout = VLMLayout.build(Qwen2VLConfig.from_hf_config(raw), 2, 2, [[2, 0], [0, 0]], [[1, 1], [1, 1]])
    release = tmp_path / "mm" / "release"
    for t in range(2):
        for p in range(2):
            held = SafetensorsFile(release / rank_dir_name(t, p, 2) / checkpoint_io.MODEL_FILE)
            assert {n: held.shape(n) for n in held} == layout.rank_shapes(t, p)
            assert {n.split(".", 1)[0] for n in held} == {"model0", "model1"}
            assert json.loads((release / rank_dir_name(t, p, 2) / checkpoint_io.META_FILE).read_text())["parallel"][
                "vpp"] == 2
    source = checkpoint_vlm.open_checkpoint(tmp_path / "mm")  # the split read back from the names
    assert (source.layout.vpp, source.layout.pipeline_num_layers("llm")) == (2, [[1, 1], [1, 1]])
    code, out, err = _run(capsys, "Qwen2VLConverter", "resplit", source_dir=str(tmp_path / "mm"),
                          target_dir=str(tmp_path / "flat"),
                          **{"source_parallel_config.llm_pp_layers": [[1, 1], [1, 1]],
                             "target_parallel_config.llm_pp_layers": [[1, 3]],
                             "target_parallel_config.vit_pp_layers": [[2, 0]], "target_parallel_config.tp_size": 1})
    assert code == 0, err
    assert "vit_pp_layers [[2, 0], [0, 0]], llm_pp_layers [[1, 1], [1, 1]]" in out
    code, out, err = _run(capsys, "Qwen2VLConverter", "mm_to_hf", save_hf_dir=str(tmp_path / "back"),
                          mm_dir=str(tmp_path / "flat"), **{"hf_config.hf_dir": str(hf)})
    assert code == 0, err
    original, back = _tensors(hf), _tensors(tmp_path / "back")
    assert sorted(original) == sorted(back) and not [n for n in original if original[n] != back[n]]


def test_mm_convert_command_lines_of_the_guides_parse_unchanged():
    """The seeds' (000_*.txt) and MindSpeed-MM docs' command lines, token for token, on a 7B-shaped config."""
    seven_b = Qwen2VLConfig.from_hf_config({"model_type": "qwen2_vl", "num_hidden_layers": 28,
                                            "num_attention_heads": 28, "num_key_value_heads": 4,
                                            "hidden_size": 3584, "intermediate_size": 18944, "vocab_size": 152064})
    hf_to_mm = ("--cfg.mm_dir ckpt/mm_path/Qwen2-VL-7B-Instruct "
                "--cfg.hf_config.hf_dir ckpt/hf_path/Qwen2-VL-7B-Instruct --cfg.parallel_config.llm_pp_layers [[1,10,10,7]] --cfg.parallel_config.vit_pp_layers [[32,0,0,0]] "
                "--cfg.parallel_config.tp_size 1").split()
    mm_to_hf = ("--cfg.save_hf_dir ckpt/mm_to_hf/Qwen2-VL-7B-Instruct --cfg.mm_dir ckpt/mm_path/Qwen2-VL-7B-Instruct "
                "--cfg.hf_config.hf_dir ckpt/hf_path/Qwen2-VL-7B-Instruct --cfg.parallel_config.llm_pp_layers "
                "[1,10,10,7] --cfg.parallel_config.vit_pp_layers [32,0,0,0] --cfg.parallel_config.tp_size 1").split()
    resplit = ("--cfg.source_dir save_dir --cfg.target_dir ckpt/resplit --cfg.source_parallel_config.llm_pp_layers "
               "[1,10,10,7] --cfg.source_parallel_config.vit_pp_layers [32,0,0,0] "
               "--cfg.source_parallel_config.tp_size 1 --cfg.target_parallel_config.llm_pp_layers [14,14] "
               "--cfg.target_parallel_config.vit_pp_layers [32,0] --cfg.target_parallel_config.tp_size 2").split()
    for tokens, key in ((hf_to_mm, "parallel_config"), (mm_to_hf, "parallel_config"),
                        (resplit, "source_parallel_config")):
        layout = convert._layout(parse_options(tokens), key, seven_b)
        assert (layout.tp, layout.vit_pp_layers, layout.llm_pp_layers) == (1, (32, 0, 0, 0), (1, 10, 10, 7))
    target = convert._layout(parse_options(resplit), "target_parallel_config", seven_b)
    assert (target.tp, target.vit_pp_layers, target.llm_pp_layers) == (2, (32, 0), (14, 14))
    assert parse_options(resplit)["target_dir"] == "ckpt/resplit"


@pytest.fixture(scope="module")
def converted(tmp_path_factory, tiny):
    """A Qwen2-VL HF directory and its (TP=2, PP=2) conversion, shared by the bad-input tests (never changed)."""
    root = tmp_path_factory.mktemp("converted")
    hf = _hf_dir(root / "hf", _hf_config(tiny, "qwen2_vl"), "float32")
    assert main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(root / "mm"), "--cfg.hf_config.hf_dir", str(hf),
                 "--cfg.parallel_config.llm_pp_layers", "[2,2]", "--cfg.parallel_config.vit_pp_layers", "[2,0]",
                 "--cfg.parallel_config.tp_size", "2"]) == 0
    return root


@pytest.mark.parametrize("sub, options, message", [
    ("hf_to_mm", {"parallel_config.llm_pp_layers": [[3, 2]]}, "llm_pp_layers [[3, 2]] sums to 5, but the text "
                                                               "decoder has 4 layers"),
    ("hf_to_mm", {"parallel_config.llm_pp_layers": [[2, 2]], "parallel_config.vit_pp_layers": [[2]]},
     "give different numbers of pipeline stages"),
    ("hf_to_mm", {"parallel_config.llm_pp_layers": [[2, 2]], "parallel_config.vit_pp_layers": [[1, 1]]},
     "puts ViT layers after the first stage"),
    ("hf_to_mm", {"parallel_config.tp_size": 3}, "is not divisible by --tensor-model-parallel-size 3"),
    ("hf_to_mm", {"parallel_config.llm_pp_layers": [[2, 2], [0, 0]]}, "leaves a virtual stage without decoder layers"),
    ("hf_to_mm", {"parallel_config.llm_pp_layers": [[1, 1], [1, 1]], "parallel_config.vit_pp_layers": [[2, 0]]},
     "give different numbers of pipeline stages or virtual chunks"),
    ("hf_to_mm", {"parallel_config.llm_pp_layers": [[1, 1], [1]]}, "each as long as the others"),
    ("mm_to_hf", {"parallel_config.llm_pp_layers": [1, 3], "parallel_config.vit_pp_layers": [2, 0],
                  "parallel_config.tp_size": 2},
     "which holds tp_size 2, vit_pp_layers [2, 0], llm_pp_layers [2, 2]; pass those"),
    ("resplit", {"target_parallel_config.tp_size": 8},
     "vision num_attention_heads 4 is not divisible by --tensor-model-parallel-size 8"),
])
def test_what_does_not_fit_is_one_line_exit_2_nothing_written(sub, options, message, converted, tmp_path, capsys):
    out_dir = tmp_path / "out"
    paths = {"hf_to_mm": {"mm_dir": str(out_dir), "hf_config.hf_dir": str(converted / "hf")},
             "mm_to_hf": {"save_hf_dir": str(out_dir), "mm_dir": str(converted / "mm"),
                          "hf_config.hf_dir": str(converted / "hf")},
             "resplit": {"source_dir": str(converted / "mm"), "target_dir": str(out_dir)}}[sub]
    code, _, err = _run(capsys, "Qwen2VLConverter", sub, **paths, **options)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err, err
    assert not out_dir.exists()


def test_wrong_converter_for_the_checkpoint(converted, tmp_path, capsys):
    code, _, err = _run(capsys, "Qwen2_5_VLConverter", "resplit", source_dir=str(converted / "mm"),
                        target_dir=str(tmp_path / "out"))
    assert code == 2 and "Qwen2_5_VLConverter converts model_type qwen2_5_vl, but the checkpoint in" in err, err
    assert "says qwen2_vl; use Qwen2VLConverter" in err and not (tmp_path / "out").exists()


def test_missing_rank_directory_and_mixed_splits(converted, tmp_path, capsys):
    broken = tmp_path / "broken"
    shutil.copytree(converted / "mm", broken)
    shutil.rmtree(broken / "release" / "mp_rank_01_001")
    code, _, err = _run(capsys, "Qwen2VLConverter", "resplit", source_dir=str(broken), target_dir=str(tmp_path / "o"))
    assert code == 2 and "is missing rank directories mp_rank_01_001 for tensor-parallel size 2 x pipeline size 2" \
        in err, err
    # rank 1 of stage 1 from another split ([1, 3]): the stage's tensor-parallel ranks disagree
    other = tmp_path / "other"
    assert main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(other), "--cfg.hf_config.hf_dir",
                 str(converted / "hf"), "--cfg.parallel_config.llm_pp_layers", "[1,3]",
                 "--cfg.parallel_config.vit_pp_layers", "[2,0]", "--cfg.parallel_config.tp_size", "2"]) == 0
    shutil.copytree(other / "release" / "mp_rank_01_001", broken / "release" / "mp_rank_01_001")
    capsys.readouterr()
    code, _, err = _run(capsys, "Qwen2VLConverter", "resplit", source_dir=str(broken), target_dir=str(tmp_path / "o"))
    assert code == 2 and "hold different tensors" in err and "come from different splits" in err, err
    assert not (tmp_path / "o").exists()


def test_an_interrupted_conversion_leaves_the_old_output_and_no_temporary(converted, tmp_path, capsys, monkeypatch):
    target = tmp_path / "mm"
    shutil.copytree(converted / "mm", target)
    before = _tensors(target / "release" / "mp_rank_00_000")
    reads = {"n": 0}
    real = hf_checkpoint.HFWeights.__getitem__

    def interrupted(self, name):
        reads["n"] += 1
        if reads["n"] == 20:
            raise KeyboardInterrupt  # Ctrl-C half-way through the tensors
        return real(self, name)

    monkeypatch.setattr(hf_checkpoint.HFWeights, "__getitem__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        main(["Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir", str(target), "--cfg.hf_config.hf_dir",
              str(converted / "hf"), "--cfg.parallel_config.tp_size", "1"])
    assert _tensors(target / "release" / "mp_rank_00_000") == before  # the old (TP=2, PP=2) output, untouched
    assert sorted(p.name for p in target.iterdir()) == ["latest_checkpointed_iteration.txt", "release"]
    monkeypatch.undo()
    with pytest.raises(KeyboardInterrupt):
        _interrupt_mm_to_hf(monkeypatch, target, converted / "hf", tmp_path / "hf-out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mm"]  # nothing, and no temporary


def _interrupt_mm_to_hf(monkeypatch, mm_dir: Path, hf: Path, out: Path) -> None:
    reads = {"n": 0}
    real = SafetensorsFile.__getitem__

    def interrupted(self, name):
        reads["n"] += 1
        if reads["n"] == 200:
            raise KeyboardInterrupt
        return real(self, name)

    monkeypatch.setattr(SafetensorsFile, "__getitem__", interrupted)
    main(["Qwen2VLConverter", "mm_to_hf", "--cfg.save_hf_dir", str(out), "--cfg.mm_dir", str(mm_dir),
          "--cfg.hf_config.hf_dir", str(hf)])


def test_memory_is_bounded_by_the_largest_tensor_not_the_model(tiny, tmp_path, capsys, monkeypatch):
    """A model of 48 layers (22 MB as fp32, 72 times its largest tensor) converted with tracemalloc on: numpy's
    allocations peak at a few times the largest tensor, far below the model; progress lines come at every tenth."""
    raw = {**_hf_config(tiny, "qwen2_5_vl", num_hidden_layers=24, hidden_size=128, intermediate_size=256,
                        vocab_size=512, num_attention_heads=4, num_key_value_heads=2),
           "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
           "vision_config": {**tiny.VISION["qwen2_5_vl"], "depth": 24, "hidden_size": 64, "intermediate_size": 256,
                             "out_hidden_size": 128, "fullatt_block_indexes": [23]}}
    hf = _hf_dir(tmp_path / "hf", raw, "bfloat16")
    config = Qwen2VLConfig.from_hf_config(raw)
    layout = VLMLayout.build(config, 2, 2)
    model_bytes = 4 * sum(int(np.prod(s)) for s in layout.full_shapes().values())
    largest = 4 * max(int(np.prod(s)) for s in layout.full_shapes().values())
    assert model_bytes > 60 * largest
    monkeypatch.setattr(checkpoint_vlm, "PROGRESS_MIN_BYTES", 0)
    peaks = {}
    steps = [("hf_to_mm", ["--cfg.mm_dir", str(tmp_path / "mm"), "--cfg.hf_config.hf_dir", str(hf),
                           "--cfg.parallel_config.tp_size", "2", "--cfg.parallel_config.llm_pp_layers", "[[12,12]]",
                           "--cfg.parallel_config.vit_pp_layers", "[[24,0]]"]),
             ("resplit", ["--cfg.source_dir", str(tmp_path / "mm"), "--cfg.target_dir", str(tmp_path / "pp3"),
                          "--cfg.target_parallel_config.llm_pp_layers", "[8,8,8]",
                          "--cfg.target_parallel_config.vit_pp_layers", "[24,0,0]"]),
             ("mm_to_hf", ["--cfg.save_hf_dir", str(tmp_path / "back"), "--cfg.mm_dir", str(tmp_path / "pp3"),
                           "--cfg.hf_config.hf_dir", str(hf)])]
    for sub, options in steps:
        tracemalloc.start()
        try:
            assert main(["Qwen2_5_VLConverter", sub, *options]) == 0
            peaks[sub] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        out = capsys.readouterr().out
        progress = [line for line in out.splitlines() if line.startswith("[")]
        tensors = len(mm_layout.hf_shapes(config) if sub == "mm_to_hf" else layout.full_shapes())
        assert 8 <= len(progress) <= 11 and progress[-1].startswith(f"[{tensors}/{tensors}] tensors, "), out
    # measured: 1.5 to 1.9 MB (5 to 6 times the largest tensor) against a 22 MB model
    assert all(peak < min(10 * largest, model_bytes / 8) for peak in peaks.values()), (peaks, largest, model_bytes)
    assert _tensors(hf) == _tensors(tmp_path / "back")


def test_a_killed_conversion_leaves_the_old_output_and_the_next_one_clears_its_temporary(converted, tmp_path):
    """SIGKILL (the test hook of the loop's save sequence) after the new output is complete but before it
    replaces the old one: the old output stays whole; the next conversion removes the dead one's temporary."""
    target = tmp_path / "mm"
    shutil.copytree(converted / "mm", target)
    before = _tensors(target / "release" / "mp_rank_01_001")
    env = {k: v for k, v in os.environ.items() if k != "MMRUN_AI_FRAMEWORK"}  # PYTHONPATH kept: the same mmrun
    env["MMRUN_TEST_KILL_DURING_SAVE"] = "release:written"
    command = [sys.executable, "-m", "mmrun.launchers.cli", "convert", "Qwen2VLConverter", "hf_to_mm", "--cfg.mm_dir",
               str(target), "--cfg.hf_config.hf_dir", str(converted / "hf")]
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _tensors(target / "release" / "mp_rank_01_001") == before
    assert len(list(target.glob(".release.mmrun-tmp-*"))) == 1  # the dead writer's complete copy
    del env["MMRUN_TEST_KILL_DURING_SAVE"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in target.iterdir()) == ["latest_checkpointed_iteration.txt", "release"]
    assert sorted(p.name for p in (target / "release").iterdir()) == ["mp_rank_00"]


def test_a_partial_parallel_config_is_checked_for_what_it_gives(converted, tmp_path, capsys):
    """mm_to_hf with only the guide's tp_size: the layers per stage come from the files."""
    code, out, err = _run(capsys, "Qwen2VLConverter", "mm_to_hf", save_hf_dir=str(tmp_path / "hf"),
                          mm_dir=str(converted / "mm"), **{"hf_config.hf_dir": str(converted / "hf"),
                                                           "parallel_config.tp_size": 2})
    assert code == 0, err
    assert _tensors(tmp_path / "hf") == _tensors(converted / "hf")
