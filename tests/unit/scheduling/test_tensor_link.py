"""The tensor adapter's start-up checks: which output feeds which input, and whether they fit."""

from __future__ import annotations

import re

import numpy as np
import pytest

from streamer.config import StageInput
from streamer.errors import ConfigError
from streamer.runtime.acl.device_tensor import AclDeviceTensor, HandedOut
from streamer.runtime.base import ModelInfo, TensorInfo
from streamer.scheduling.tensor_link import TensorLink, check_batch_sizes

F32 = np.dtype(np.float32)


def info(
    name: str, inputs: dict[str, tuple[int, ...]], outputs: dict[str, tuple[int, ...]]
) -> ModelInfo:
    return ModelInfo(
        name,
        tuple(TensorInfo(k, v, F32) for k, v in inputs.items()),
        tuple(TensorInfo(k, v, F32) for k, v in outputs.items()),
    )


BACKBONE = info(
    "backbone",
    {"input": (-1, 3, 128, 128)},
    {"aux": (-1, 10), "activation_16": (-1, 96, 8, 8), "activation_11": (-1, 88, 16, 16)},
)
HEAD = info(
    "head",
    {"activation_11": (-1, 88, 16, 16), "activation_16": (-1, 96, 8, 8)},
    {"regressors": (-1, 896, 16)},
)


def resolve(text: str, upstream: ModelInfo = BACKBONE, downstream: ModelInfo = HEAD) -> TensorLink:
    return TensorLink.resolve(StageInput.parse(text), upstream, downstream)


def test_inputs_are_fed_by_the_outputs_of_their_names_in_input_order() -> None:
    assert resolve("backbone:tensor").sources == (2, 1)


def test_a_map_feeds_inputs_of_other_names() -> None:
    renamed = info("head", {"x": (-1, 88, 16, 16), "y": (4, 96, -1, 8)}, {})
    link = resolve("backbone:tensor:activation_16=y,activation_11=x", downstream=renamed)
    assert link.sources == (2, 1)


def test_one_output_feeds_a_single_input_whatever_their_names() -> None:
    single = info("head", {"features": (-1, 88, 16, 16)}, {})
    assert resolve("backbone:tensor:activation_11", downstream=single).sources == (2,)
    one_out = info("trunk", {}, {"out": (-1, 88, 16, 16)})
    assert resolve("trunk:tensor", upstream=one_out, downstream=single).sources == (0,)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("backbone:tensor:nope", "stage 'backbone' has no output 'nope'"),
        ("backbone:tensor:aux=z", "the model has no input 'z'"),
        (
            "backbone:tensor:activation_11,activation_11",
            "input 'activation_11' is fed twice",
        ),
        ("backbone:tensor:activation_11", "inputs ['activation_16'] are fed by no output"),
    ],
)
def test_names_that_do_not_fit_are_errors(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        resolve(text)


def test_a_shape_mismatch_names_both_stages_tensors_and_shapes() -> None:
    with pytest.raises(ConfigError) as caught:
        resolve("backbone:tensor:activation_11=activation_16,activation_16=activation_11")
    assert str(caught.value) == (
        "stage 'backbone' output 'activation_11' [-1, 88, 16, 16] float32 does not fit stage "
        "'head' input 'activation_16' [-1, 96, 8, 8] float32: dim 1 is 88 vs 96 (the batch "
        "dim aside)"
    )


def test_rank_and_dtype_must_agree() -> None:
    flat = info("head", {"activation_11": (-1, 88 * 16 * 16)}, {})
    with pytest.raises(ConfigError, match="the ranks differ"):
        resolve("backbone:tensor:activation_11", downstream=flat)
    half = ModelInfo("head", (TensorInfo("x", (-1, 88, 16, 16), np.dtype(np.float16)),), ())
    with pytest.raises(ConfigError, match="the dtypes differ"):
        resolve("backbone:tensor:activation_11", downstream=half)


def test_the_downstream_must_run_every_batch_size_the_upstream_executes() -> None:
    link = resolve("backbone:tensor")
    check_batch_sizes(link, (1, 2, 4, 8), HEAD)  # any batch
    gears = ModelInfo("head", HEAD.inputs, HEAD.outputs, batch_gears=(4, 8))
    check_batch_sizes(link, (4, 8), gears)
    with pytest.raises(ConfigError) as caught:
        check_batch_sizes(link, (1, 2, 4, 8), gears)
    assert "'backbone' executes batch sizes [1, 2, 4, 8], 'head' has no gear for [1, 2]" in str(
        caught.value
    )


def test_host_arrays_are_handed_over_as_they_are() -> None:
    outputs = tuple(np.zeros((2, 1)) for _ in range(3))
    handover = resolve("backbone:tensor").hand_over(outputs)
    assert handover.inputs[0] is outputs[2] and handover.inputs[1] is outputs[1]
    assert handover.device is None


def test_device_outputs_no_input_takes_are_released_at_once_the_rest_after_the_head() -> None:
    """The batch's memory goes back once, when its last tensor is released."""
    freed: list[str] = []
    hold = HandedOut().hold(3, lambda: freed.append("batch"))
    outputs = [AclDeviceTensor(0x100 * i, 64, (2, 1), F32, 0, i, hold) for i in range(1, 4)]
    handover = resolve("backbone:tensor").hand_over(outputs)
    assert handover.inputs == (outputs[2], outputs[1]) and handover.device == 0
    assert freed == []  # "aux" dropped: two tensors still held
    handover.release()
    handover.release()
    assert freed == ["batch"]
