"""How the training loop meets the framework's autograd: Megatron's `forward_step` recorded, then replayed.

`forward_step(data_iterator, model)` runs in plain Python, outside any gradient recording, against a
stand-in for the model that records the call (`model(tokens, ...)`) instead of running it. The train
step then replays exactly that call, and the loss function `forward_step` returned, inside TrainStep,
which differentiates it: `loss.backward()` on PyTorch, `mindspore.value_and_grad` on MindSpore (and
`mindspore.jit`, which cannot compile the Python iterator `get_batch` reads). So `forward_step` must
return the model's output unchanged, as Megatron's does.

MindSpore's jit compiles the replayed loss, so it needs the loss function as `functools.partial(loss_func,
...)` (Megatron's form): its tensors become graph inputs. A closure cannot be compiled; then the plan
falls back to PyNative with one notice, unless jit was asked for explicitly (--ms-jit), which is an error.
"""
from __future__ import annotations

import collections
import functools
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from mmrun.engines.base import TrainingError


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, (int, float, bool))


class _PendingOutput:
    """What the recording model returns to forward_step: a placeholder for the real output."""

    def __repr__(self) -> str:
        return "<model output, computed later inside the train step>"


class _RecordingModel:
    """Stands in for the model while forward_step runs: records `model(...)`, forwards attribute reads."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self.calls: list[tuple[tuple, dict]] = []
        self.output = _PendingOutput()

    def __call__(self, *args: Any, **kwargs: Any) -> _PendingOutput:
        self.calls.append((args, kwargs))
        return self.output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@dataclass(frozen=True)
class _Template:
    """Where each tensor of one micro-batch goes: model call arguments and loss-function arguments.
    Entries are ("t", slot) for a tensor slot or ("c", value) for a constant."""

    model_args: tuple
    model_kwargs: tuple  # ((name, entry), ...)
    loss_func: Callable
    loss_args: tuple
    loss_kwargs: tuple
    loss_is_partial: bool


def _entries(values: Iterable[Any], flat: list) -> tuple:
    out = []
    for v in values:
        if _is_tensor(v):
            out.append(("t", len(flat)))
            flat.append(v)
        else:
            out.append(("c", v))
    return tuple(out)


def _resolve(entries: tuple, flat: Sequence[Any]) -> list:
    return [flat[x] if kind == "t" else x for kind, x in entries]


class ForwardPlan:
    """Runs forward_step outside autograd and replays its model call + loss inside the train step."""

    def __init__(self, forward_step_func: Callable, model: Any, jit: bool, jit_required: bool = False,
                 notice: Callable[[str], None] | None = None) -> None:
        """`jit`: the step will be compiled (MindSpore); `jit_required`: asked for explicitly (--ms-jit), so
        a closure loss is an error instead of a fallback to PyNative (announced once through `notice`)."""
        self.forward_step_func = forward_step_func
        self.model = model
        self.jit = jit
        self.jit_required = jit_required
        self.notice = notice or (lambda message: print(message, file=sys.stderr, flush=True))
        self.template: _Template | None = None  # the first micro-batch's: a compiled step replays only this one
        # Eager steps replay each micro-batch's own template and loss closure in capture order (TrainStep
        # computes the micro-batches in the order they were captured): a text-only micro-batch of a VLM
        # passes pixel_values=None where the others pass a tensor.
        self._templates: collections.deque = collections.deque()
        self._closures: collections.deque = collections.deque()

    def capture(self, data_iterator: Iterator) -> tuple:
        """One micro-batch: call forward_step (which reads the iterator) and return its tensors."""
        recorder = _RecordingModel(self.model)
        returned = self.forward_step_func(data_iterator, recorder)
        if not (isinstance(returned, tuple) and len(returned) == 2 and callable(returned[1])):
            raise TrainingError(f"forward_step must return (output_tensor, loss_func) as Megatron's does. "
                                f"Received: {type(returned).__name__}")
        output, loss = returned
        if len(recorder.calls) != 1 or output is not recorder.output:
            raise TrainingError(
                "forward_step must call the model once and return its output unchanged (the train step replays "
                f"that call under the framework's autograd). Received: {len(recorder.calls)} model call(s), "
                f"returned {output!r}; move work on the output into loss_func")
        (args, kwargs), = recorder.calls
        flat: list = []
        is_partial = isinstance(loss, functools.partial)
        if not is_partial and self.jit:
            if self.jit_required:
                raise TrainingError("with --ms-jit, forward_step must return functools.partial(loss_func, ...) as "
                                    f"Megatron's does, so the loss can be compiled. Received: {loss!r}")
            self.jit = False
            self.notice(f"notice: forward_step returned {getattr(loss, '__qualname__', type(loss).__name__)}, not "
                        "functools.partial(loss_func, ...), which mindspore.jit cannot compile; the train step runs "
                        "in PyNative (slower). Return partial(loss_func, ...) as Megatron does to compile it")
        template = _Template(
            model_args=_entries(args, flat),
            model_kwargs=tuple((k, e) for k, e in zip(kwargs, _entries(kwargs.values(), flat))),
            loss_func=loss.func if is_partial else loss,
            loss_args=_entries(loss.args, flat) if is_partial else (),
            loss_kwargs=(tuple((k, e) for k, e in zip(loss.keywords, _entries(loss.keywords.values(), flat)))
                         if is_partial else ()),
            loss_is_partial=is_partial,
        )
        if not is_partial:
            self._closures.append(loss)  # its tensors are constants of this micro-batch
        if self.template is None:
            self.template = template
        elif self.template != template and self.jit:
            raise TrainingError("every micro-batch must call the model and loss_func with the same arguments "
                                "(tensors in the same places) to compile the step; forward_step changed them "
                                "between micro-batches: run without --ms-jit, or keep the arguments the same")
        if not self.jit:
            self._templates.append(template)
        return tuple(flat)

    def loss(self, model: Any, *flat: Any) -> Any:
        """TrainStep's loss_fn: the recorded model call, then the loss function, as one scalar."""
        t = self.template if self.jit else self._templates.popleft()
        args = _resolve(t.model_args, flat)
        kwargs = {k: v for (k, _), v in zip(t.model_kwargs, _resolve(tuple(e for _, e in t.model_kwargs), flat))}
        output = model(*args, **kwargs)
        if t.loss_is_partial:
            loss_kwargs = {k: v for (k, _), v in zip(t.loss_kwargs, _resolve(tuple(e for _, e in t.loss_kwargs), flat))}
            result = t.loss_func(*_resolve(t.loss_args, flat), output, **loss_kwargs)
        else:
            result = self._closures.popleft()(output)
        return scalar_loss(result)


def scalar_loss(result: Any) -> Any:
    """Megatron's loss_func returns (loss_sum, num_tokens, report) (core 0.12) or (loss, report) (older):
    the per-micro-batch loss is loss_sum / num_tokens, or loss."""
    if isinstance(result, tuple) and len(result) == 3:
        return result[0] / result[1]
    if isinstance(result, tuple) and len(result) == 2:
        return result[0]
    return result
