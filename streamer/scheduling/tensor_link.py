"""The ``tensor`` adapter: an upstream stage's outputs become the next stage's inputs as they are.

``input = "<stage>:tensor[:<map>]"`` (:class:`~streamer.config.StageInput`) links two single
stages: every batch the upstream executes goes on to the downstream model as that same batch
(same frames, same rows, padding included), its outputs picked and ordered as the downstream
inputs by :class:`TensorLink`. Nothing is decoded, re-batched or copied between the two: on
onnxruntime the output arrays are the next session's inputs; on ACL they stay in device memory
(:class:`~streamer.runtime.base.DeviceTensor`) and the next model reads them there.

Checked at start (:meth:`TensorLink.resolve`, :func:`check_batch_sizes`): every downstream
input is fed by exactly one upstream output of the same rank and dtype whose dims match apart
from the batch dim (a dynamic ``-1`` matches any size), and every batch size the upstream
executes is one the downstream accepts. Errors name both stages, the tensors and the shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamer.config import StageInput
from streamer.errors import ConfigError
from streamer.runtime.base import (
    DYNAMIC,
    DeviceTensor,
    ModelInfo,
    Tensor,
    TensorInfo,
    release_inputs,
)

__all__ = ["Handover", "TensorLink", "check_batch_sizes"]


@dataclass(eq=False)
class Handover:
    """The downstream inputs made from one upstream batch; its frames share it.

    Attributes:
        inputs: one tensor per downstream input, in that model's input order, batch first
            with the upstream batch's rows: host arrays, or device tensors on ``device``.
        device: the device whose memory holds ``inputs``, or None for host arrays (any
            replica of the downstream stage may run them).
    """

    inputs: tuple[Tensor, ...]
    device: int | None

    def release(self) -> None:
        """Give device memory back when the batch will not run downstream (see
        :class:`~streamer.runtime.base.DeviceTensor` for who owns what)."""
        release_inputs(self.inputs)


@dataclass(frozen=True)
class TensorLink:
    """Which upstream output feeds each input of the downstream model.

    Attributes:
        upstream, downstream: the two stages' names.
        sources: for each downstream input (model order), the index of its upstream output.
    """

    upstream: str
    downstream: str
    sources: tuple[int, ...]

    @classmethod
    def resolve(cls, source: StageInput, upstream: ModelInfo, downstream: ModelInfo) -> TensorLink:
        """Match the downstream inputs to upstream outputs (by name, or by the map) and check
        their shapes and dtypes.

        Args:
            source: the downstream stage's parsed ``input`` (adapter ``tensor``).
            upstream, downstream: the two loaded models (``name`` = stage name).

        Raises:
            ConfigError: an output or input the models lack, an input fed twice or not at
                all, or a pair whose rank, dtype or non-batch dims differ.
        """
        pairs = _pairs(source, upstream, downstream)
        names = [t.name for t in downstream.inputs]
        fed: dict[int, int] = {}
        for output, name in pairs:
            index = names.index(name)
            if index in fed:
                raise ConfigError(
                    f"stage {downstream.name!r}: input {name!r} is fed twice by the map of "
                    f"input {_text(source)!r}"
                )
            fed[index] = output
            _check_pair(upstream, upstream.outputs[output], downstream, downstream.inputs[index])
        missing = [names[i] for i in range(len(names)) if i not in fed]
        if missing:
            outputs = [t.name for t in upstream.outputs]
            raise ConfigError(
                f"stage {downstream.name!r}: inputs {missing} are fed by no output of stage "
                f"{upstream.name!r} (outputs {outputs}); name them in "
                f'input = "{source.upstream}:tensor:<output>=<input>,..."'
            )
        return cls(upstream.name, downstream.name, tuple(fed[i] for i in range(len(names))))

    def hand_over(self, outputs: Sequence[Tensor]) -> Handover:
        """The downstream inputs from one upstream batch's outputs; outputs no input takes
        are released at once."""
        release_inputs([o for i, o in enumerate(outputs) if i not in self.sources])
        inputs = tuple(outputs[i] for i in self.sources)
        devices = {t.device for t in inputs if isinstance(t, DeviceTensor)}
        return Handover(inputs, devices.pop() if devices else None)


def check_batch_sizes(link: TensorLink, executed: Sequence[int], downstream: ModelInfo) -> None:
    """The downstream model must run every batch size the upstream executes (its batches go
    on as they are).

    Args:
        link: the resolved link.
        executed: the batch sizes the upstream stage's policy executes.
        downstream: the downstream model.

    Raises:
        ConfigError: a size the downstream model has no gear for.
    """
    accepted = downstream.batch_gears
    missing = sorted(set(executed) - set(accepted)) if accepted else []
    if missing:
        raise ConfigError(
            f"stage {link.downstream!r} runs the batches of stage {link.upstream!r} as they "
            f"are: {link.upstream!r} executes batch sizes {sorted(set(executed))}, "
            f"{link.downstream!r} has no gear for {missing} (its gears: {list(accepted)})"
        )


def _pairs(source: StageInput, upstream: ModelInfo, downstream: ModelInfo) -> list[tuple[int, str]]:
    """``(upstream output index, downstream input name)`` for every link of ``source``.

    Raises:
        ConfigError: a name neither model has, or an unnamed input that cannot be chosen.
    """
    outputs = [t.name for t in upstream.outputs]
    inputs = [t.name for t in downstream.inputs]
    if not source.pairs:
        if len(outputs) == 1 and len(inputs) == 1:
            return [(0, inputs[0])]
        return [(outputs.index(name), name) for name in inputs if name in outputs]
    pairs = []
    for output, name in source.pairs:
        if output not in outputs:
            raise ConfigError(
                f"stage {downstream.name!r}: input {_text(source)!r}: stage {upstream.name!r} "
                f"has no output {output!r}; its outputs: {outputs}"
            )
        target = name or (output if output in inputs or len(inputs) != 1 else inputs[0])
        if target not in inputs:
            raise ConfigError(
                f"stage {downstream.name!r}: input {_text(source)!r}: the model has no input "
                f"{target!r}; its inputs: {inputs}"
            )
        pairs.append((outputs.index(output), target))
    return pairs


def _check_pair(
    upstream: ModelInfo, output: TensorInfo, downstream: ModelInfo, tensor: TensorInfo
) -> None:
    """Rank, dtype and every dim but the batch must agree (``-1`` agrees with any size).

    Raises:
        ConfigError: they do not, naming both stages, tensors, shapes and dtypes.
    """
    problem = None
    if output.dtype != tensor.dtype:
        problem = "the dtypes differ"
    elif len(output.shape) != len(tensor.shape):
        problem = "the ranks differ"
    else:
        for axis, (a, b) in enumerate(zip(output.shape, tensor.shape, strict=True)):
            if axis and DYNAMIC not in (a, b) and a != b:
                problem = f"dim {axis} is {a} vs {b}"
                break
    if problem is not None:
        raise ConfigError(
            f"stage {upstream.name!r} output {output.name!r} {list(output.shape)} {output.dtype} "
            f"does not fit stage {downstream.name!r} input {tensor.name!r} "
            f"{list(tensor.shape)} {tensor.dtype}: {problem} (the batch dim aside)"
        )


def _text(source: StageInput) -> str:
    """``source`` written back as its ``input`` value, for messages."""
    pairs = ",".join(o if i is None else f"{o}={i}" for o, i in source.pairs)
    return f"{source.upstream}:tensor" + (f":{pairs}" if pairs else "")
