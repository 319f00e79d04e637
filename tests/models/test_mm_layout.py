"""models/vlm/mm_layout.py: MindSpeed-MM's names, the fused QKV and gate/up, tensor-parallel shards and
pipeline stages of Qwen2-VL / Qwen2.5-VL, and the initial weights of a parallel run."""
from __future__ import annotations

import numpy as np
import pytest

from mmrun.models.qwen2_vl.configuration import Qwen2VLConfig, TextConfig, VisionConfig
from mmrun.models.vlm.mm_layout import (GLU, LayoutError, OUTPUT_LAYER, VLMLayout, WORD_EMBEDDINGS, hf_shapes,
                                             hf_to_mm, initial_state, mm_to_hf)


def config(model_type: str = "qwen2_vl", layers: int = 4, tied: bool = True) -> Qwen2VLConfig:
    vision = VisionConfig(depth=2, hidden_size=16, num_heads=2, intermediate_size=32, out_hidden_size=32,
                          hidden_act="quick_gelu" if model_type == "qwen2_vl" else "silu",
                          window_size=None if model_type == "qwen2_vl" else 56,
                          fullatt_block_indexes=() if model_type == "qwen2_vl" else (1,))
    text = TextConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, mrope_section=(2, 1, 1))
    return Qwen2VLConfig(model_type=model_type, vision=vision, text=text, tie_word_embeddings=tied)


def random_hf(cfg: Qwen2VLConfig, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    if dtype == np.uint16:  # bf16 checkpoints travel as raw bits
        return {n: rng.integers(0, 2 ** 16, s, dtype=np.uint16) for n, s in hf_shapes(cfg).items()}
    return {n: rng.standard_normal(s).astype(dtype) for n, s in hf_shapes(cfg).items()}


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
def test_names_are_mindspeed_mms(model_type):
    cfg = config(model_type, tied=False)
    names = set(VLMLayout.build(cfg).full_shapes())
    block = "image_encoder.encoder.blocks.layers.1."
    layer = "text_decoder.decoder.layers.3."
    expected = {"image_encoder.encoder.patch_embed.proj.weight", block + "input_layernorm.weight",
                block + "self_attention.linear_qkv.weight", block + "self_attention.linear_proj.bias",
                block + "mlp.linear_fc1.weight", block + "mlp.linear_fc2.bias", "image_encoder.projector.layernorm.weight",
                "image_encoder.projector.encoder.linear_fc1.weight", "image_encoder.projector.encoder.linear_fc2.bias",
                WORD_EMBEDDINGS, layer + "input_layernorm.weight", layer + "self_attention.linear_qkv.bias",
                layer + "self_attention.linear_proj.weight", layer + "pre_mlp_layernorm.weight",
                layer + "mlp.linear_fc1.weight", layer + "mlp.linear_fc2.weight",
                "text_decoder.decoder.final_layernorm.weight", OUTPUT_LAYER}
    assert expected <= names
    assert ("image_encoder.projector.layernorm.bias" in names) == (model_type == "qwen2_vl")  # LayerNorm vs RMSNorm
    assert not [n for n in names if "visual" in n or n.startswith("model.")]


def test_qkv_is_interleaved_per_query_group_and_gate_up_concatenated():
    cfg = config("qwen2_5_vl")
    hf = random_hf(cfg)
    mm = dict(hf_to_mm(cfg, hf.__getitem__))
    hd, groups, per_group = cfg.text.head_dim, cfg.text.num_key_value_heads, 2  # 4 heads in 2 groups
    q, k, v = (hf[f"model.layers.0.self_attn.{m}_proj.weight"] for m in "qkv")
    fused = mm["text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"]
    for g in range(groups):
        rows = fused[g * (per_group + 2) * hd:(g + 1) * (per_group + 2) * hd]
        np.testing.assert_array_equal(rows[:per_group * hd], q[g * per_group * hd:(g + 1) * per_group * hd])
        np.testing.assert_array_equal(rows[per_group * hd:(per_group + 1) * hd], k[g * hd:(g + 1) * hd])
        np.testing.assert_array_equal(rows[(per_group + 1) * hd:], v[g * hd:(g + 1) * hd])
    vq, vk, vv = np.split(hf["visual.blocks.0.attn.qkv.weight"], 3)  # HF's ViT: [Q; K; V]
    vfused = mm["image_encoder.encoder.blocks.layers.0.self_attention.linear_qkv.weight"]
    vhd = cfg.vision.head_dim
    np.testing.assert_array_equal(vfused[:vhd], vq[:vhd])
    np.testing.assert_array_equal(vfused[vhd:2 * vhd], vk[:vhd])
    np.testing.assert_array_equal(vfused[3 * vhd:4 * vhd], vq[vhd:2 * vhd])
    np.testing.assert_array_equal(mm["text_decoder.decoder.layers.0.mlp.linear_fc1.weight"],
                                  np.concatenate([hf["model.layers.0.mlp.gate_proj.weight"],
                                                  hf["model.layers.0.mlp.up_proj.weight"]]))


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_hf_to_mm_to_hf_gives_the_same_bytes(model_type, dtype):
    cfg = config(model_type, tied=model_type == "qwen2_vl")
    hf = random_hf(cfg, dtype)
    mm = dict(hf_to_mm(cfg, hf.__getitem__))
    back = dict(mm_to_hf(cfg, mm.__getitem__))
    assert sorted(back) == sorted(hf)
    for name, array in hf.items():
        assert back[name].dtype == array.dtype and back[name].tobytes() == array.tobytes(), name


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)])
def test_every_split_holds_each_tensor_once_and_joins_back(tp, pp):
    cfg = config("qwen2_5_vl", tied=True)
    layout = VLMLayout.build(cfg, tp=tp, pp=pp)
    whole = dict(hf_to_mm(cfg, random_hf(cfg).__getitem__))
    ranks = {(t, p): layout.rank_state(whole.__getitem__, t, p) for t in range(tp) for p in range(pp)}
    for (t, p), state in ranks.items():
        assert {k: v.shape for k, v in state.items()} == layout.rank_shapes(t, p)
    rebuilt: dict[str, np.ndarray] = {}
    for name in whole:
        (stage, local), *copies = layout.locate(name)
        rebuilt[name] = layout.join(name, [ranks[(t, stage)][local] for t in range(tp)])
        assert layout.global_name(stage, local) == name
        for copy_stage, copy in copies:  # the last stage's output_layer: a copy of the word embeddings
            np.testing.assert_array_equal(layout.join(copy, [ranks[(t, copy_stage)][copy] for t in range(tp)]),
                                          whole[name])
    for name, array in whole.items():
        np.testing.assert_array_equal(rebuilt[name], array)
    assert (OUTPUT_LAYER in ranks[(0, pp - 1)]) == (pp > 1)  # tied: no output layer of its own on one stage
    held = sum(len(s) for s in ranks.values()) // tp
    assert held == len(whole) + (1 if pp > 1 else 0)


def test_stages_and_tensor_parallel_shards():
    cfg = config("qwen2_vl", layers=4)
    layout = VLMLayout.build(cfg, tp=2, pp=2, vit_pp_layers=[2, 0], llm_pp_layers=[1, 3])
    first, last = layout.rank_shapes(0, 0), layout.rank_shapes(1, 1)
    assert "image_encoder.encoder.blocks.layers.1.self_attention.linear_qkv.weight" in first
    assert WORD_EMBEDDINGS in first and "text_decoder.decoder.layers.0.input_layernorm.weight" in first
    assert "text_decoder.decoder.layers.1.input_layernorm.weight" not in first
    assert "text_decoder.decoder.layers.2.mlp.linear_fc2.weight" in last and "image_encoder.projector.layernorm.weight" not in last
    assert layout.global_name(1, "text_decoder.decoder.layers.2.mlp.linear_fc2.weight") == \
        "text_decoder.decoder.layers.3.mlp.linear_fc2.weight"
    # (nh + 2 ng) * hd rows of the fused QKV: each of 2 ranks holds one query group
    assert last["text_decoder.decoder.layers.0.self_attention.linear_qkv.weight"] == ((4 + 4) * 8 // 2, 32)
    assert last["text_decoder.decoder.layers.0.self_attention.linear_proj.weight"] == (32, 16)
    assert first["image_encoder.encoder.blocks.layers.0.self_attention.linear_proj.bias"] == (16,)
    name = "text_decoder.decoder.layers.0.mlp.linear_fc1.weight"
    assert layout.split_kind(name) == GLU
    fused = np.arange(96)[:, None] * np.ones((1, 32))  # rows 0..47 gate, 48..95 up
    np.testing.assert_array_equal(layout.shard(name, fused, 1)[:, 0], np.r_[24:48, 72:96])
    assert layout.is_sequence_parallel("text_decoder.decoder.layers.0.pre_mlp_layernorm.weight")
    assert layout.is_sequence_parallel("image_encoder.encoder.blocks.layers.0.mlp.linear_fc2.bias")
    assert not layout.is_sequence_parallel("image_encoder.encoder.blocks.layers.0.mlp.linear_fc1.bias")


@pytest.mark.parametrize("kwargs,message", [
    (dict(pp=2, llm_pp_layers=[4]), "has 1 entries for 2 pipeline stages"),
    (dict(pp=2, llm_pp_layers=[2, 1]), "sums to 3, but the text model has 4 layers"),
    (dict(pp=2, vit_pp_layers=[1, 1]), "keeps the whole ViT on stage 0: give [2, 0]"),
    (dict(pp=2, llm_pp_layers=[0, 4]), "leaves a stage without decoder layers"),
    (dict(tp=3), "is not divisible by --tensor-model-parallel-size 3"),
])
def test_splits_that_cannot_be_made_say_why(kwargs, message):
    with pytest.raises(LayoutError) as err:
        VLMLayout.build(config(), **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2


def test_the_initial_state_is_the_one_process_models(worker):
    """A parallel run starts where models/pretrain_vlm.py's data-parallel run starts: init_weights' values."""
    from mmrun.backend import tensors
    from mmrun.models.qwen2_vl.modeling import Qwen2VLForConditionalGeneration
    from mmrun.models.vlm.blocks import init_weights

    cfg = config("qwen2_vl", tied=True)
    model = Qwen2VLForConditionalGeneration(cfg)
    init_weights(model, seed=5, std=0.02)
    portable = tensors.state_dict_to_numpy(model.state_dict())
    whole = dict(hf_to_mm(cfg, portable.__getitem__))
    layout = VLMLayout.build(cfg, tp=2, pp=2)
    for t in range(2):
        for p in range(2):
            expected = layout.rank_state(whole.__getitem__, t, p)
            got = initial_state(layout, 5, t, p, std=0.02)
            assert list(got) == list(expected)
            for name in got:
                np.testing.assert_array_equal(got[name], expected[name])


# ------------------------------------------------------------------------------------------ virtual pipeline stages

VPP_LISTS = dict(vit_pp_layers=[[2, 0], [0, 0]], llm_pp_layers=[[1, 1], [1, 1]])  # MindSpeed-MM's form, chunk-major


@pytest.mark.parametrize("tp,tied", [(1, True), (2, False)])
def test_virtual_stages_split_and_join_back_with_the_engines_chunk_names(tp, tied):
    cfg = config("qwen2_vl", layers=4, tied=tied)
    layout = VLMLayout.build(cfg, tp=tp, pp=2, vpp=2, **VPP_LISTS)
    assert (layout.vpp, layout.pp, layout.llm_pp_layers) == (2, 2, (1, 1, 1, 1))
    assert layout.pipeline_num_layers("llm") == [[1, 1], [1, 1]]
    # forward order D0V0 -> D1V0 -> D0V1 -> D1V1: global decoder layer 2 is rank 0's chunk 1, local layer 0
    assert layout.locate("text_decoder.decoder.layers.2.input_layernorm.weight") == [
        (0, "model1.text_decoder.decoder.layers.0.input_layernorm.weight")]
    assert layout.locate("text_decoder.decoder.layers.1.input_layernorm.weight") == [
        (1, "model0.text_decoder.decoder.layers.0.input_layernorm.weight")]
    whole = dict(hf_to_mm(cfg, random_hf(cfg).__getitem__))
    ranks = {(t, p): layout.rank_state(whole.__getitem__, t, p) for t in range(tp) for p in range(2)}
    first, last = ranks[(0, 0)], ranks[(0, 1)]
    assert all(name.startswith(("model0.", "model1.")) for state in ranks.values() for name in state)
    assert "model0.image_encoder.encoder.blocks.layers.1.self_attention.linear_qkv.weight" in first
    assert "model0." + WORD_EMBEDDINGS in first and "model1." + WORD_EMBEDDINGS not in first
    assert "model1.text_decoder.decoder.final_layernorm.weight" in last and "model1." + OUTPUT_LAYER in last
    assert not [n for n in first if n.startswith("model1.image_encoder")]
    for (t, p), state in ranks.items():
        assert {k: v.shape for k, v in state.items()} == layout.rank_shapes(t, p)
        for v in range(2):  # one chunk's state, named inside the chunk (what model_provider(vp_stage=v) loads)
            chunk = layout.rank_state(whole.__getitem__, t, p, vp_stage=v)
            assert chunk.keys() == {n[len(f"model{v}."):] for n in state if n.startswith(f"model{v}.")}
    for name, array in whole.items():
        (stage, local), *copies = layout.locate(name)
        assert layout.global_name(stage, local) == name
        np.testing.assert_array_equal(layout.join(local, [ranks[(t, stage)][local] for t in range(tp)]), array)
        for copy_stage, copy in copies:  # tied: the last virtual stage's output_layer copies the embeddings
            np.testing.assert_array_equal(layout.join(copy, [ranks[(t, copy_stage)][copy] for t in range(tp)]),
                                          whole[name])
    assert sum(len(s) for s in ranks.values()) // tp == len(whole) + (1 if tied else 0)


def test_a_flat_list_is_one_virtual_chunk_and_the_defaults_follow_the_chunks():
    cfg = config(layers=4)
    flat = VLMLayout.build(cfg, pp=2, vit_pp_layers=[2, 0], llm_pp_layers=[2, 2], vpp=1)
    assert flat.vpp == 1 and "text_decoder.decoder.layers.1.input_layernorm.weight" in flat.rank_shapes(0, 0)
    default = VLMLayout.build(cfg, pp=2, vpp=2)
    assert default.pipeline_num_layers("vit") == [[2, 0], [0, 0]]
    assert default.pipeline_num_layers("llm") == [[1, 1], [1, 1]]


@pytest.mark.parametrize("kwargs,message", [
    (dict(pp=2, vpp=2, vit_pp_layers=[[2, 0], [0, 0]], llm_pp_layers=[[1, 1, 0], [1, 1, 0]]),
     "has a virtual chunk of 3 entries for 2 pipeline stages"),
    (dict(pp=2, vpp=2, vit_pp_layers=[[2, 0], [0, 0]], llm_pp_layers=[[1, 1], [1, 0]]), "sums to 3"),
    (dict(pp=2, vpp=2, vit_pp_layers=[[1, 0], [1, 0]], llm_pp_layers=[[1, 1], [1, 1]]),
     "after the first virtual stage (chunk 0 of stage 0); mmrun keeps the whole ViT on stage 0: give [[2, 0], [0, 0]]"),
    (dict(pp=2, vpp=2, vit_pp_layers=[[2, 0], [0, 0]], llm_pp_layers=[[2, 1], [0, 1]]),
     "leaves a virtual stage without decoder layers"),
    (dict(pp=2, vpp=1, **VPP_LISTS), "holds 2 virtual chunks per stage, but the run has "
                                     "--virtual-pipeline-model-parallel-size 1; pass 2"),
    (dict(pp=2, vpp=2, vit_pp_layers=[2, 0], llm_pp_layers=[2, 2]), "holds 1 virtual chunk per stage"),
    (dict(pp=2, vit_pp_layers=[2, 0], llm_pp_layers=[[1, 1], [1, 1]]), "give both the same form"),
    (dict(pp=2, llm_pp_layers=[[1, 1], 2]), "mixes counts and lists"),
    (dict(pp=1, vpp=2), "need --pipeline-model-parallel-size 2 or more"),
])
def test_virtual_splits_that_cannot_be_made_say_why(kwargs, message):
    with pytest.raises(LayoutError) as err:
        VLMLayout.build(config(layers=4), **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert err.value.exit_code == 2
