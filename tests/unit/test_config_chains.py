"""Chains in the config: the ``input`` forms and the tables each kind of stage may have."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamer.config import Config, StageInput, load_config
from streamer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]

HEAD = """
[[ingress]]
uri = "pull+bind:tcp://127.0.0.1:5555"
[[egress]]
uri = "pub+bind:tcp://127.0.0.1:5556"
"""

BACKBONE = """
[[models]]
name = "backbone"
path = "backbone.onnx"
preprocess = { kind = "letterbox" }
"""

TENSOR_HEAD = """
[[models]]
name = "head"
path = "head.onnx"
input = "backbone:tensor"
postprocess = { kind = "blazeface" }
"""


def load(tmp_path: Path, *models: str) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(HEAD + "".join(models))
    return load_config(path)


def error(tmp_path: Path, *models: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, *models)
    return str(info.value)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("frame", StageInput()),
        ("face:crops", StageInput("face", "crops")),
        ("backbone:tensor", StageInput("backbone", "tensor")),
        (
            "backbone:tensor:onnx::Conv_7=x, y",
            StageInput("backbone", "tensor", (("onnx::Conv_7", "x"), ("y", None))),
        ),
    ],
)
def test_input_forms(text: str, parsed: StageInput) -> None:
    assert StageInput.parse(text) == parsed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("face:scale", 'expected "frame", "<stage>:crops"'),
        (":tensor", 'expected "frame", "<stage>:crops"'),
        ("face:crops:x", "the crops adapter takes no tensor map"),
        ("face:tensor:a=", "'a=' is not <output> or <output>=<input>"),
        ("face:tensor:a,,b", "'' is not <output> or <output>=<input>"),
    ],
)
def test_bad_inputs_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        StageInput.parse(text)


def test_the_shipped_split_config_is_a_tensor_chain() -> None:
    config = load_config(ROOT / "configs" / "blazeface_split.toml")
    backbone, head = config.chain()
    assert backbone.postprocess is None and head.preprocess is None
    assert head.source == StageInput("backbone", "tensor")


def test_a_tensor_chain_loads_in_any_order(tmp_path: Path) -> None:
    config = load(tmp_path, TENSOR_HEAD, BACKBONE)
    assert [m.name for m in config.chain()] == ["backbone", "head"]


def test_a_stage_feeding_a_tensor_stage_has_no_postprocess(tmp_path: Path) -> None:
    with_post = BACKBONE + 'postprocess = { kind = "blazeface" }\n'
    message = error(tmp_path, with_post, TENSOR_HEAD)
    assert "models 'backbone': it feeds 'head' through the tensor adapter" in message
    assert "remove its [models.postprocess]" in message


def test_every_other_stage_needs_a_postprocess(tmp_path: Path) -> None:
    message = error(tmp_path, BACKBONE)
    assert "models 'backbone': [models.postprocess] is required" in message


def test_a_tensor_stage_has_no_preprocess_and_no_batch_table(tmp_path: Path) -> None:
    with_pre = TENSOR_HEAD + 'preprocess = { kind = "letterbox" }\n'
    assert "remove its [models.preprocess]" in error(tmp_path, BACKBONE, with_pre)
    with_batch = TENSOR_HEAD + "batch = { max_size = 4 }\n"
    assert "set [models.batch] on 'backbone' instead" in error(tmp_path, BACKBONE, with_batch)


def test_unknown_upstream_and_cycles_are_named(tmp_path: Path) -> None:
    unknown = TENSOR_HEAD.replace("backbone:tensor", "trunk:tensor")
    assert "input 'trunk:tensor': no stage 'trunk'" in error(tmp_path, BACKBONE, unknown)
    loop = BACKBONE + '[[models]]\nname = "a"\npath = "a.onnx"\ninput = "b:tensor"\n'
    loop += '[[models]]\nname = "b"\npath = "b.onnx"\ninput = "a:tensor"\n'
    loop = loop.replace('preprocess = { kind = "letterbox" }', 'postprocess = { kind = "x" }')
    assert "models: Value error, stages ['a', 'b'] form a cycle" in error(tmp_path, loop)


def test_a_cycle_without_a_frame_stage_is_named_as_a_cycle(tmp_path: Path) -> None:
    backbone = BACKBONE.replace('preprocess = { kind = "letterbox" }', 'input = "head:tensor"')
    message = error(tmp_path, backbone, TENSOR_HEAD)
    assert "stages ['backbone', 'head'] form a cycle ('head' -> 'backbone' -> 'head'" in message
    assert "exactly one model" not in message
    itself = TENSOR_HEAD.replace("backbone:tensor", "head:tensor")
    assert "stages ['head'] form a cycle ('head' -> 'head'" in error(tmp_path, BACKBONE, itself)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("backbone:tensor:", 'the tensor map after "tensor:" is empty'),
        ("backbone:tensor: ", 'the tensor map after "tensor:" is empty'),
        ("face:crops:", "the crops adapter takes no tensor map"),
    ],
)
def test_an_empty_map_after_the_adapter_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        StageInput.parse(text)


@pytest.mark.parametrize("name", ["", "face:v2", "face v2", "face/2", "gesicht:"])
def test_a_model_name_is_letters_digits_and_dot_dash_underscore(tmp_path: Path, name: str) -> None:
    message = error(tmp_path, BACKBONE.replace('"backbone"', f'"{name}"'))
    assert (
        f"models[0] ({name!r}).name: Value error, {name!r}: a model name is letters, digits"
        in message
    )
