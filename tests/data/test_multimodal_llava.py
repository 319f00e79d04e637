"""LLaVA-Instruct -> mllm_format, as MindSpeed-MM's llava_instruct_2_mllm_demo_format.py."""
from __future__ import annotations

import json

import pytest

from mmrun.data.gpt_dataset import DatasetConfigError
from mmrun.data.multimodal.llava import convert_llava, main

LLAVA = [
    {"id": "000000033471", "image": "000000033471.jpg", "conversations": [
        {"from": "human", "value": "<image>\nWhat are the colors of the bus in the image?"},
        {"from": "gpt", "value": "The bus in the image is white and red."},
        {"from": "human", "value": "What feature can be seen on the back of the bus?"},
        {"from": "gpt", "value": "The back of the bus features an advertisement."}]},
    {"id": "text-1", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
    {"id": "000000000009", "image": "000000000009.jpg", "conversations": [
        {"from": "human", "value": "<image>\nWhat food is this?"}, {"from": "gpt", "value": "Broccoli and rice."}]},
]


def test_convert(tmp_path):
    source, out = tmp_path / "llava.json", tmp_path / "mllm.json"
    source.write_text(json.dumps(LLAVA))
    assert convert_llava(str(source), str(out)) == {"converted": 3, "skipped": 0}
    converted = json.loads(out.read_text())
    assert converted[0] == {"images": ["./train2017/000000033471.jpg"], "messages": [
        {"role": "user", "content": "<image>\nWhat are the colors of the bus in the image?"},
        {"role": "assistant", "content": "The bus in the image is white and red."},
        {"role": "user", "content": "What feature can be seen on the back of the bus?"},
        {"role": "assistant", "content": "The back of the bus features an advertisement."}]}
    assert converted[1]["images"] == []
    with pytest.raises(DatasetConfigError, match="already exists"):
        convert_llava(str(source), str(out))
    # with the COCO root, samples whose image is missing are skipped (MindSpeed-MM's --coco_path)
    (tmp_path / "coco" / "train2017").mkdir(parents=True)
    (tmp_path / "coco" / "train2017" / "000000000009.jpg").write_bytes(b"")
    counts = convert_llava(str(source), str(out), image_root=str(tmp_path / "coco"), overwrite=True)
    assert counts == {"converted": 2, "skipped": 1}
    assert [r["images"] for r in json.loads(out.read_text())] == [[], ["./train2017/000000000009.jpg"]]


def test_unknown_speaker_and_cli(tmp_path, capsys):
    source = tmp_path / "llava.json"
    source.write_text(json.dumps([{"id": "x7", "conversations": [{"from": "robot", "value": "?"}]}]))
    with pytest.raises(DatasetConfigError, match=r"llava.json: sample 0 \(id 'x7'\): conversation turn 0 has "
                                                 r"speaker 'robot'; expected human or gpt"):
        convert_llava(str(source), str(tmp_path / "out.json"))
    assert not (tmp_path / "out.json").exists()
    source.write_text(json.dumps(LLAVA))
    assert main([str(source), str(tmp_path / "out.json"), "--image-prefix", "imgs"]) == 0
    assert "wrote 3 samples" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())[2]["images"] == ["imgs/000000000009.jpg"]
    assert main([str(source), str(tmp_path / "out.json")]) == 1
    assert "already exists" in capsys.readouterr().err
