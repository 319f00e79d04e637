"""The VLM (models/pretrain_vlm.py) on MindSpore's Megatron-design tensor/pipeline/sequence parallelism
(engines/mindspore/parallel/vlm.py): real msrun jobs through `mmrun`, compared with the one-process runs of
conftest.py's `vlm` fixture.

The parallel runs start from the one-process run's weights (mm_layout.initial_state, sharded per rank), read the
same micro-batches and compute the same loss (the mean over each micro-batch's label tokens), so every
iteration's loss equals the one-process PyTorch run's within 1e-5 (and so MindSpore's own one-process run's, which
test_pretrain_vlm.py compares). TP=2 x PP=2 with sequence parallelism trains the 10 iterations; TP=2 alone trains 4
iterations of one sample per micro-batch (its last step holds a micro-batch without images), both compiled on
fixed-shape batches; PP=2 the first 2 of Megatron's --calculate-per-token-loss (the same schedule: --exit-interval)
in PyNative (--no-ms-jit), the shapes following the images.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.numpy import load_file

TOLERANCE = 1e-5
ITERS = 10
SHORT = 2


# The demo's model.json split over two pipeline stages (MindSpeed-MM's pipeline_num_layers per module: the ViT and
# the first text layer on stage 0, the second text layer on stage 1); the same model as model_tiny.json.
PP2_JSON = Path(__file__).resolve().parents[2] / "scripts" / "qwen2vl" / "model_tiny_pp2.json"


@pytest.fixture(scope="module")
def runs(vlm, tmp_path_factory):
    """The `vlm` fixture with the MindSpore parallel runs registered."""
    pp2 = ["--mm-model", str(PP2_JSON), "--pipeline-model-parallel-size", "2"]
    hf_init = _hf_directory_of_the_initial_weights(vlm, tmp_path_factory.mktemp("vlm_ms_parallel") / "hf-init")
    vlm.add("ms-tp2pp2-sp", "mindspore", 4, [*pp2, "--tensor-model-parallel-size", "2", "--sequence-parallel",
                                             "--save-interval", "5"])
    # one sample per micro-batch, as conftest's "text-rank-dp1": iteration 4's second micro-batch is the demo's
    # text-only sample 7, for which every TP rank runs the ViT on a blank image that counts zero times. It starts
    # from a Hugging Face directory holding the one-process run's initial weights (--load, sharded per rank).
    cache = tmp_path_factory.mktemp("vlm_ms_parallel_cache")
    vlm.add("ms-tp2-text-only", "mindspore", 2, ["--tensor-model-parallel-size", "2", "--train-iters", "4",
                                                 "--micro-batch-size", "1", "--global-batch-size", "2",
                                                 "--load", str(hf_init), "--ms-compile-cache", str(cache)])
    vlm.compile_cache = cache
    vlm.hf_init = hf_init
    # with Megatron's per-token loss, against the one-process run of conftest's "per-token" (3 iterations)
    # ... in PyNative (--no-ms-jit: the grids read on the host), the others compiled on fixed-shape batches
    vlm.add("ms-pp2-per-token", "mindspore", 2, [*pp2, "--train-iters", "3", "--calculate-per-token-loss",
                                                 "--exit-interval", str(SHORT), "--no-ms-jit"])
    return vlm


def _hf_directory_of_the_initial_weights(vlm, path: Path) -> Path:
    """The one-process run's initial weights (--seed 42, std 0.02: mm_layout.initial_value) as a Hugging Face
    directory, for --load."""
    from mmrun.models.qwen2_vl import hf_checkpoint
    from mmrun.models.vlm import mm_layout
    from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
    from mmrun.models.vlm.model_json import read_model_json

    args = vlm.args
    seed = int(args[args.index("--seed") + 1])
    config = Qwen2VLConfig.from_hf_config(read_model_json(args[args.index("--mm-model") + 1]).hf_config)
    arrays = {name: mm_layout.initial_value(name, shape, seed, 0.02)  # Megatron's default --init-method-std
              for name, shape in mm_layout.hf_shapes(config).items()}
    return hf_checkpoint.save_hf_directory(path, config, arrays, dtype="float32")


def _gap(run, reference, iterations) -> float:
    losses, expected = run.losses(), reference.losses()
    assert sorted(losses) == list(iterations), losses
    return max(abs(losses[i] - expected[i]) for i in iterations)


@pytest.mark.slow
def test_tp2_pp2_with_sequence_parallelism_trains_the_one_process_losses(runs):
    run = runs("ms-tp2pp2-sp")
    assert _gap(run, runs("pytorch"), range(1, ITERS + 1)) <= TOLERANCE, (run.losses(), runs("pytorch").losses())
    norms = {m["iteration"]: m["grad_norm"] for m in run.metrics if m["kind"] == "train"}
    expected = {m["iteration"]: m["grad_norm"] for m in runs("pytorch").metrics if m["kind"] == "train"}
    assert max(abs(norms[i] - expected[i]) for i in expected) <= 1e-4, (norms, expected)
    assert "tensor-parallel 2, pipeline-parallel 2, sequence-parallel" in run.output


@pytest.mark.slow
@pytest.mark.parametrize("name, reference, iterations", [("ms-tp2-text-only", "text-rank-dp1", 4),
                                                         ("ms-pp2-per-token", "per-token", SHORT)])
def test_tp2_and_pp2_alone_train_the_one_process_losses(runs, name, reference, iterations):
    assert _gap(runs(name), runs(reference), range(1, iterations + 1)) <= TOLERANCE, (runs(name).losses(),
                                                                                      runs(reference).losses())
    if name == "ms-tp2-text-only":
        assert f"loaded Hugging Face weights from {runs.hf_init}, this rank's shard" in runs(name).output


@pytest.mark.slow
def test_the_split_step_compiles_once_and_says_so(runs):
    """TP=2 trains compiled on batches padded to fixed shapes (one bucket here, a text-only micro-batch
    included): each graph's first call is printed once as compilation; --no-ms-jit stays PyNative."""
    output = runs("ms-tp2-text-only").output
    assert "> MindSpore parallel train step: mindspore.jit (graph), on batches padded to fixed shapes" in output
    compiled = [line for line in output.splitlines() if line.startswith("> MindSpore compiled the train step (parallel")]
    assert [line.split(")")[0] for line in compiled] == [
        "> MindSpore compiled the train step (parallel forward-backward graph",
        "> MindSpore compiled the train step (parallel gradient norm graph",
        "> MindSpore compiled the train step (parallel clipping and AdamW graph"], compiled
    assert "for batch shapes [1x128, 3x1x128, " in compiled[0]
    # --ms-compile-cache: the job's own folder, each rank's graphs saved for a rerun (engines/compile_cache.py)
    assert "> MindSpore compile cache: " in output and "(empty: saving the graphs)" in output
    (job,) = runs.compile_cache.iterdir()
    assert {p.parent.parent.name for p in job.glob("rank_*/graph_cache/*.mindir")} == {"rank_0", "rank_1"}
    assert "> MindSpore parallel train step: PyNative" in runs("ms-pp2-per-token").output


@pytest.mark.slow
def test_checkpoint_has_the_layouts_names_and_shards_per_rank(runs):
    """Each (TP, PP) rank directory holds exactly mm_layout's tensors for that rank (MindSpeed-MM's names, the
    tied output copy on the last stage), and the shards joined over TP equal the whole tensors' shapes."""
    from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig
    from mmrun.models.vlm.mm_layout import VLMLayout
    from mmrun.models.vlm.model_json import read_model_json

    spec = read_model_json(PP2_JSON)
    layout = VLMLayout.build(Qwen2VLConfig.from_hf_config(spec.hf_config), tp=2, pp=2,
                             vit_pp_layers=spec.pipeline_layers["vit"], llm_pp_layers=spec.pipeline_layers["llm"])
    runs("ms-tp2pp2-sp")  # trained once, shared with the loss test
    iteration = runs.ckpt("ms-tp2pp2-sp") / "iter_0000005"
    for tp_rank in range(2):
        for pp_rank in range(2):
            rank_dir = iteration / f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
            meta = json.loads((rank_dir / "meta.json").read_text())
            assert meta["model_names"] == "mindspeed-mm"
            tensors = load_file(rank_dir / "model.safetensors")
            assert {n: t.shape for n, t in tensors.items()} == layout.rank_shapes(tp_rank, pp_rank), rank_dir
    assert "text_decoder.output_layer.weight" in load_file(iteration / "mp_rank_00_001" / "model.safetensors")


@pytest.mark.slow
def test_pytorch_and_mindspore_train_the_same_split_alike(runs):
    """The same TP=2 x PP=2 + SP layout on both frameworks: megatron-core's VLM (conftest's "mcore-tp2pp2-sp") and
    MindSpore's, iteration by iteration."""
    pt, ms = runs("mcore-tp2pp2-sp"), runs("ms-tp2pp2-sp")
    assert _gap(ms, pt, range(1, ITERS + 1)) <= TOLERANCE, (ms.losses(), pt.losses())


@pytest.mark.slow
def test_a_pytorch_tp2_pp2_checkpoint_resumes_on_mindspore(runs, tk):
    """Cross-framework resume at TP=2 x PP=2: megatron-core's VLM on PyTorch saved iteration 8 with the same names
    per rank; MindSpore loads it and trains iterations 9 and 10 with the one-process losses."""
    split = ["--mm-model", str(PP2_JSON), "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
             "--sequence-parallel"]
    runs("mcore-tp2pp2-sp")  # trained once per session: by this test when it runs alone
    copy = tk.resume_copy(runs.ckpt("mcore-tp2pp2-sp"), runs.base_dir / "pt-tp2pp2-at-8", 8)
    # PyNative: two steps after the load do not pay back four ranks' compile (ms-tp2pp2-sp compiles this split)
    resumed = tk.run_training(runs.base_dir / "pt-to-ms", [*runs.args, "--mm-data", runs.data_json, *split,
                                                            "--load", str(copy), "--no-ms-jit"],
                              framework="mindspore", nproc=4, timeout=600, entry=runs.entry)
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert "saved by pytorch; resuming on mindspore" in resumed.output
    assert _gap(resumed, runs("pytorch"), range(9, ITERS + 1)) <= TOLERANCE


@pytest.mark.slow
def test_pipeline_num_layers_that_do_not_fit_are_one_line_errors(runs, tk, tmp_path):
    """model.json's per-stage lists are checked against the run's stages before any model is built."""
    run = tk.run_training(tmp_path / "bad", [*runs.args, "--mm-data", runs.data_json, "--mm-model", str(PP2_JSON)],
                          nproc=None, entry=runs.entry)
    errors = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1, run.output[-2000:]
    assert "pipeline_num_layers [2, 0] has 2 entries for 1 pipeline stages" in errors[0], errors
    assert "Traceback" not in run.output



def test_model_json_virtual_chunks_are_refused_in_one_line():
    """MindSpore has no interleaved schedule (its engine refuses --virtual-pipeline-model-parallel-size): model.json's
    lists of lists are refused as one line naming the flat form, before any model is built."""
    from mmrun.backend.errors import UsageError
    from mmrun.engines.mindspore.parallel.vlm import refuse_virtual_stages
    from mmrun.models.vlm.model_json import read_model_json

    with pytest.raises(UsageError) as err:
        refuse_virtual_stages(read_model_json(PP2_JSON.parent / "model_tiny_vpp.json"))
    message = str(err.value)
    assert "pipeline_num_layers [[2, 0], [0, 0]] gives 2 virtual pipeline chunks per stage" in message
    assert "Give one count per stage, e.g. [2, 0]" in message and "\n" not in message and err.value.exit_code == 2
    refuse_virtual_stages(read_model_json(PP2_JSON))  # flat lists pass
