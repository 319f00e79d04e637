"""get_rope_index equals transformers 5.x's Qwen2-VL and Qwen2.5-VL methods exactly (called unbound, no model built)."""
from __future__ import annotations

import functools
import types
import warnings

import numpy as np
import pytest

from mmrun.data.multimodal.rope_index import RopeConfig, get_rope_index

IMG, VID, VS, VE = 250, 251, 252, 253
MERGE = 2


def _vision(grid, token):
    return [VS] + [token] * (int(np.prod(grid)) // MERGE ** 2) + [VE]


def _batch():
    """Three rows, right-padded: image+text+video, text only, two images; grids consumed in row order."""
    rng = np.random.default_rng(0)
    text = lambda n: rng.integers(1, 200, n).tolist()  # noqa: E731
    images = [[1, 4, 6], [1, 2, 2], [1, 6, 4]]
    videos = [[3, 2, 4], [2, 4, 2]]
    rows = [
        text(5) + _vision(images[0], IMG) + text(3) + _vision(videos[0], VID) + text(4) + _vision(videos[1], VID) + text(2),
        text(11),
        text(2) + _vision(images[1], IMG) + text(1) + _vision(images[2], IMG) + text(6),
    ]
    length = max(map(len, rows)) + 3
    ids = np.zeros((len(rows), length), np.int64)
    mask = np.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = row
        mask[r, :len(row)] = 1
    return ids, mask, np.array(images, np.int64), np.array(videos, np.int64)


@pytest.fixture(scope="module")
def hf():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    return torch, Qwen2VLModel, Qwen2_5_VLModel


def _reference(cls, torch, ids, mask, images, videos, tokens_per_second=None, seconds=None):
    # The methods read only config.vision_config and get_vision_position_ids (which does not use self).
    vision = types.SimpleNamespace(spatial_merge_size=MERGE, tokens_per_second=tokens_per_second)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(cls.get_vision_position_ids, fake)
    ids_t = torch.from_numpy(ids)
    token_types = (ids_t == IMG).int() + 2 * (ids_t == VID).int()
    kwargs = {} if seconds is None else {"second_per_grid_ts": torch.tensor(seconds, dtype=torch.float32)}
    pos, delta = cls.get_rope_index(fake, ids_t, token_types, image_grid_thw=torch.from_numpy(images),
                                    video_grid_thw=torch.from_numpy(videos), attention_mask=torch.from_numpy(mask),
                                    **kwargs)
    return pos.numpy(), delta.numpy()


IDS = dict(spatial_merge_size=MERGE, image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS)


def test_qwen2_vl_equal_to_transformers(hf):
    torch, qwen2, _ = hf
    ids, mask, images, videos = _batch()
    want_pos, want_delta = _reference(qwen2, torch, ids, mask, images, videos)
    pos, delta = get_rope_index(ids, images, videos, mask, **IDS)
    assert pos.dtype == np.int64 and delta.dtype == np.int64 and pos.shape == (3, 3, ids.shape[1])
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(delta, want_delta)
    assert (pos[:, 1, :11] == np.arange(11)).all() and delta[1, 0] == 0  # the text-only row


@pytest.mark.parametrize("seconds", [None, [0.5, 2 / 3]])
def test_qwen2_5_vl_equal_to_transformers(hf, seconds):
    torch, _, qwen25 = hf
    ids, mask, images, videos = _batch()
    want_pos, want_delta = _reference(qwen25, torch, ids, mask, images, videos, tokens_per_second=2, seconds=seconds)
    pos, delta = get_rope_index(ids, images, videos, mask, **IDS, tokens_per_second=2,
                                second_per_grid_ts=None if seconds is None else np.array(seconds, np.float32))
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(delta, want_delta)


def test_no_mask_and_text_only():
    ids = np.arange(1, 9).reshape(1, 8)
    pos, delta = get_rope_index(ids, **IDS)
    assert (pos == np.arange(8)).all() and delta.tolist() == [[0]]


def test_a_cut_image_run_is_an_error():
    ids = np.array([[1, VS] + [IMG] * 3])
    with pytest.raises(ValueError, match="does not match its grid"):
        get_rope_index(ids, np.array([[1, 4, 4]]), **IDS)


def test_rope_config_from_model_config():
    cfg = RopeConfig.from_model_config({"model_type": "qwen2_5_vl", "image_token_id": 5, "video_token_id": 6,
                                        "vision_start_token_id": 7, "vision_config": {"tokens_per_second": 2}})
    assert cfg == RopeConfig(2, 5, 6, 7, 2)
    assert RopeConfig.from_model_config({"model_type": "qwen2_vl", "image_token_id": 5, "video_token_id": 6,
                                         "vision_start_token_id": 7}).tokens_per_second is None
