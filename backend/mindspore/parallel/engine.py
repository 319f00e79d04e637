"""One training step of a tensor/pipeline/data-parallel model on MindSpore, as megatron-core trains it.

    step = ParallelTrainStep(model, optimizer, state, clip_grad=1.0, lr_scheduler=schedule)
    result = step([(tokens, position_ids, labels, loss_mask), ...])   # one tuple per micro-batch
    result.loss, result.grad_norm, result.lr                           # the same floats on every rank

`model` is this rank's pipeline stage (engines/mindspore/parallel/gpt.py GPTModel or anything with the same call and
`parameter_roles()`); every rank gets every micro-batch and uses what its stage needs (tokens and positions on
the first stage, labels and the loss mask on the last). A micro-batch is `fields` long: the model's inputs, then
labels and loss_mask; the model is called `model(*inputs, hidden_in, labels)` on every stage (a stage that is not
the first gets `hidden_in` from the previous one and may read the inputs too: a VLM's text layers read their
M-RoPE positions on every stage). Micro-batches may differ in shape (a VLM's batches are padded to their own
longest sample): each pipeline message is sized from its own micro-batch. The step, in megatron-core's order:

1. forward and backward over the micro-batches: one after the other without pipeline parallelism, else
   Megatron's 1F1B schedule (warm-up forwards, one-forward-one-backward, cool-down backwards) with activations
   and their gradients sent between stages (p2p.py). The loss of a micro-batch is Megatron's
   sum(loss * mask) / max(sum(mask), 1), divided by the number of micro-batches before the backward.
2. finalize the gradients (megatron-core's finalize_model_grads): mean over the data-parallel group; with
   sequence parallelism, the sum over the TP group of the LayerNorm and row-parallel bias gradients; with
   tied embeddings over 2+ stages, the sum of the first stage's word-embedding gradient and the last stage's
   output-layer copy over the embedding group, so both copies take the same update.
3. the gradient norm over the whole model (Megatron's get_grad_norm_fp32: squares of the gradients this rank
   owns, counting a replicated parameter on TP rank 0 only and the tied copy once, summed over the
   model-parallel group), clipping to --clip-grad, and AdamW on this rank's parameters.

Backward on a pipeline stage re-runs that stage's forward under `mindspore.value_and_grad` with the received
output gradient (full activation recomputation, Megatron's `--recompute-granularity full`): MindSpore's
functional autodiff keeps no tape between calls, and a `vjp` closure taken before later forwards fails in
PyNative ("Can not find top cell for backward"; MindSpore 2.10's vjp closures run last-in first-out only, 1F1B
needs first-in first-out). The last stage runs forward and backward as one call, so only the other stages
compute each forward twice.

Dropout: before each micro-batch's forward (and its recomputation) the dropout generator is set to the offset
one process running the whole model would have reached there (the model's `dropout_draws()`), so the
recomputation draws the same masks, and with the model's ShardedDropout every TP/PP split draws the masks of
a single process.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import mindspore as ms
import numpy as np
from mindspore import mint
from mindspore.ops import functional as F

from mmrun.backend.errors import UsageError
from mmrun.backend.mindspore import optim, seeding, tensors
from mmrun.backend.mindspore.parallel.groups import ParallelState
from mmrun.backend.mindspore.parallel.p2p import PipelineP2P
from mmrun.backend.mindspore.train_step import DEFAULT_JIT, _announce_first_call
from mmrun.backend.train_step_shared import StepResult, advance_schedule, check_micro_batches, set_step_lr

MICRO_BATCH_FIELDS = ("tokens", "position_ids", "labels", "loss_mask")
# What each compiled piece of the step is, for the line printed when it compiles.
_GRAPHS = {"backward": "forward-backward", "forward": "forward", "norm": "gradient norm",
           "apply": "clipping and AdamW"}


@dataclass(frozen=True)
class ParameterRoles:
    """What the gradient finalization and the norm must know about a stage's parameters (by name)."""

    tensor_parallel: frozenset[str] = frozenset()  # split over the TP group: every TP rank counts its part
    sequence_parallel: frozenset[str] = frozenset()  # replicated, gradients summed over TP (sequence parallelism)
    tied_embedding: str | None = None  # this stage's copy of the tied word embeddings, when stages differ
    shared_copy: str | None = None  # the copy the norm leaves out (megatron's `shared` attribute)
    # expert parallelism (engines/mindspore/parallel/qwen3_moe.py): the experts' parameters, whose gradients are
    # summed over the expert-data-parallel group (not the data-parallel one) and whose squares over the EP group
    experts: frozenset[str] = frozenset()
    expert_data_parallel: Any = None  # groups.Group
    expert_parallel: Any = None  # groups.Group


def megatron_loss(per_token_loss, loss_mask):
    """Megatron's loss_func with its schedule's division: sum(loss * mask) / max(sum(mask), 1)."""
    mask = mint.reshape(F.cast(loss_mask, ms.float32), (-1,))
    return mint.sum(mint.reshape(per_token_loss, (-1,)) * mask) / mint.clamp(mint.sum(mask), min=1.0)


def _as_tensor(value: Any) -> ms.Tensor:
    return value if isinstance(value, ms.Tensor) else tensors.from_numpy(value)


def _all_reduce_flat(tensors: Sequence[ms.Tensor], group: str | None, scale: float = 1.0) -> list[ms.Tensor]:
    """The tensors times `scale`, summed over `group` with one collective on a flat buffer."""
    flat = mint.cat([mint.reshape(t, (-1,)) for t in tensors])
    if scale != 1.0:
        flat = flat * scale
    pieces = mint.split(_all_reduce_(flat, group), [int(t.size) for t in tensors])
    return [mint.reshape(p, t.shape) for p, t in zip(pieces, tensors)]


def _all_reduce_(tensor: ms.Tensor, group: str | None) -> ms.Tensor:
    """Sum over `group` in place (nothing in a group of one)."""
    if group is not None:
        import mindspore.mint.distributed as mdist
        mdist.all_reduce(tensor, group=group)
    return tensor


class ParallelTrainStep(ms.nn.Cell):
    """forward/backward schedule + gradient finalization + clipping + AdamW for one tensor/pipeline/data-parallel
    rank. Same call and result as mmrun.backend.mindspore.train_step.TrainStep (StepResult)."""

    def __init__(self, model: ms.nn.Cell, optimizer: optim.AdamW, state: ParallelState, clip_grad: float = 1.0,
                 lr_scheduler: Any = None, increment: int = 1, jit: bool | None = None,
                 loss_func: Callable[[Any, Any], Any] | None = None,
                 fields: Sequence[str] = MICRO_BATCH_FIELDS, hidden_size: int | None = None) -> None:
        super().__init__(auto_prefix=False)
        self.model, self.optimizer, self.state = model, optimizer, state
        self.clip_grad = float(clip_grad)
        self.lr_scheduler, self.increment = lr_scheduler, increment
        self.loss_func = loss_func or megatron_loss
        self.fields = tuple(fields)
        self.hidden_size = int(hidden_size or model.config.hidden_size)  # of the messages between stages
        self.jit = DEFAULT_JIT if jit is None else bool(jit)
        self.first, self.last = state.is_first_stage, state.is_last_stage
        self.names = list(optimizer.names)
        half = sorted({str(p.dtype) for p in optimizer.params if p.dtype != ms.float32})
        if half:
            # No loss scaling and fp32 pipeline buffers here: fp16/bf16 would silently underflow or mismatch.
            raise UsageError(f"the MindSpore tensor/pipeline-parallel engine trains in fp32 only. Received parameters "
                             f"in {', '.join(half)}; drop --fp16/--bf16 (on Ascend, MindSpore's own parallel modes "
                             "are the engine for mixed precision)")
        roles = model.parameter_roles()
        self.roles = roles
        own = set(self.names)
        unknown = sorted((set(roles.tensor_parallel) | set(roles.sequence_parallel)) - own)
        if unknown:
            raise ValueError(f"parameter_roles() names parameters the optimizer does not hold: {unknown[:3]}")
        self._sequence_index = [i for i, n in enumerate(self.names) if n in roles.sequence_parallel]
        self._tied_index = self.names.index(roles.tied_embedding) if roles.tied_embedding in own else None
        tp_rank = state.tp_rank
        self._norm_flags = tuple((n in roles.tensor_parallel or tp_rank == 0) and n != roles.shared_copy
                                 for n in self.names)
        self._expert_index = [i for i, n in enumerate(self.names) if n in roles.experts]
        if self._expert_index:  # counted apart (grad_norm): summed over the EP group first
            self._norm_flags = tuple(f and n not in roles.experts for f, n in zip(self._norm_flags, self.names))
        params = optimizer.params
        wrap = ms.jit if self.jit else (lambda fn: fn)
        if self.first and self.last:
            grad = ms.value_and_grad(self._whole_loss, None, params, has_aux=True)
        elif self.last:
            grad = ms.value_and_grad(self._last_loss, 0, params, has_aux=True)
        elif self.first:
            grad = ms.value_and_grad(self._first_dot, None, params)
        else:
            grad = ms.value_and_grad(self._middle_dot, 0, params)
        self._grad_fn = grad
        # The norm's all-reduce over the model-parallel group runs inside its graph (AllReduce compiles on every
        # device; on CPU mccl), so the host reads nothing between the gradients and the update.
        mp = state.groups["mp"].name
        self._mp_reduce = ms.ops.AllReduce(ms.ops.ReduceOp.SUM, mp) if mp else None
        self._loss_owner = ms.Tensor(float(self.last and tp_rank == 0), ms.float32)  # one copy of the loss summed
        self._compiled = {"backward": wrap(self._backward), "forward": wrap(self._forward),
                          "forward_eval": wrap(self._forward_eval),
                          "evaluate": wrap(self._evaluate), "norm": ms.jit(self._norm),
                          "apply": ms.jit(self._apply)}
        self._p2p: PipelineP2P | None = None
        self.announce: Callable[[str], None] | None = None  # prints each graph's first (compiling) call once
        self._compiled_shapes: set = set()
        draws = getattr(model, "dropout_draws", None)
        self._draws = draws() if draws is not None else (0, 0)
        self._dropout_start: dict[str, int] = {}

    # ------------------------------------------------------------------ what gets differentiated

    def _whole_loss(self, inputs, labels, loss_mask, scale):
        loss = self.loss_func(self.model(*inputs, None, labels), loss_mask)
        return loss * scale, loss

    def _last_loss(self, hidden_in, inputs, labels, loss_mask, scale):
        loss = self.loss_func(self.model(*inputs, hidden_in, labels), loss_mask)
        return loss * scale, loss

    def _first_dot(self, inputs, output_grad):
        return mint.sum(self.model(*inputs, None, None) * output_grad)

    def _middle_dot(self, hidden_in, inputs, output_grad):
        return mint.sum(self.model(*inputs, hidden_in, None) * output_grad)

    # ------------------------------------------------------------------ compiled pieces

    def _backward(self, acc, batch, hidden_in, output_grad, scale):
        """Gradients of one micro-batch added to `acc`; returns (loss or 0, input gradient or 0, acc)."""
        inputs, labels, loss_mask = batch
        zero = F.cast(0.0, ms.float32)
        if self.first and self.last:
            (_, loss), grads = self._grad_fn(inputs, labels, loss_mask, scale)
            input_grad = zero
        elif self.last:
            (_, loss), (input_grad, grads) = self._grad_fn(hidden_in, inputs, labels, loss_mask, scale)
        elif self.first:
            _, grads = self._grad_fn(inputs, output_grad)
            loss, input_grad = zero, zero
        else:
            _, (input_grad, grads) = self._grad_fn(hidden_in, inputs, output_grad)
            loss = zero
        return loss, input_grad, tuple([a + F.cast(g, ms.float32) for a, g in zip(acc, grads)])

    def _forward(self, batch, hidden_in):
        return self.model(*batch[0], hidden_in, None)

    def _forward_eval(self, batch, hidden_in):
        # Its own graph: a graph compiled by mindspore.jit keeps the training mode it was compiled in, so
        # sharing _forward with the 1F1B schedule would put eval-mode (no dropout) forwards into training, or
        # dropout into evaluation, whichever ran first.
        return self.model(*batch[0], hidden_in, None)

    def _evaluate(self, batch, hidden_in):
        inputs, labels, loss_mask = batch
        return self.loss_func(self.model(*inputs, hidden_in, labels), loss_mask)

    def _squares(self, grads):
        """Sum of squares of the gradients this rank owns for the norm (megatron's grads_for_norm)."""
        total = F.cast(0.0, ms.float32)
        for g, counted in zip(grads, self._norm_flags):
            if counted:
                total = total + mint.sum(g * g)
        return total

    def _norm(self, grads, loss, expert_squares):
        """(the global gradient norm, the last stage's loss) on every rank: this rank's squares (its experts' already
        summed over their EP group) and its loss summed over the model-parallel group in one all-reduce."""
        squares = self._squares(grads) + expert_squares
        pair = mint.cat([mint.reshape(squares, (1,)), mint.reshape(loss * self._loss_owner, (1,))])
        if self._mp_reduce is not None:
            pair = self._mp_reduce(pair)
        return mint.sqrt(pair[0]), pair[1]

    def _apply(self, grads, norm, scalars):
        grads, norm = optim.clip_grad_norm(grads, self.clip_grad, total=norm)
        return F.depend(norm, self.optimizer(grads, scalars))

    # ------------------------------------------------------------------ the step

    def _micro_batches(self, micro_batches: Sequence[Sequence[Any]]) -> list:
        check_micro_batches(micro_batches)
        batches = []
        for mb in micro_batches:
            if len(mb) != len(self.fields):
                raise ValueError(f"a micro-batch is ({', '.join(self.fields)}). Received {len(mb)} values")
            # None stays None (a VLM micro-batch without images); compiled graphs take tensors only.
            values = tuple(None if v is None else _as_tensor(v) for v in mb)
            # (inputs, labels, loss_mask), split here: slicing a tuple inside a compiled graph fails to compile
            inputs = values[:-2]
            batches.append(ms.mutable((ms.mutable(inputs), values[-2], values[-1])) if self.jit
                           else (inputs, values[-2], values[-1]))
            seq, tp = values[0].shape[-1], self.state.tensor_model_parallel_size
            if self.state.sequence_parallel and seq % tp:
                raise UsageError(f"with --sequence-parallel the sequence length ({seq}) must be divisible by "
                                 f"--tensor-model-parallel-size ({tp}); change --seq-length")
        return batches

    def _message_shape(self, batch) -> tuple[int, int, int]:
        """[s, b, h] of the activations sent between stages for this micro-batch ([s / tp, b, h] with SP)."""
        b, s = batch[0][0].shape
        if self.state.sequence_parallel:
            s //= self.state.tensor_model_parallel_size
        return (s, b, self.hidden_size)

    def _pipeline(self, batch) -> PipelineP2P:
        shape = self._message_shape(batch)
        if self._p2p is None or self._p2p.shape != shape:
            self._p2p = PipelineP2P(self.state, shape)
        return self._p2p

    def compute_gradients(self, micro_batches: Sequence[Sequence[Any]]) -> tuple[ms.Tensor, tuple[ms.Tensor, ...]]:
        """Forward and backward over the micro-batches and the finalized gradients of this rank's parameters
        (aligned with optimizer.names), before clipping; the loss (a scalar tensor, not read here) is the mean
        over micro-batches and data-parallel ranks, on the last stage."""
        batches = self._micro_batches(micro_batches)
        num = len(batches)
        self.model.set_train(True)  # Megatron's train_step runs the model in training mode (dropout on)
        scale = ms.Tensor(1.0 / num, ms.float32)
        acc = ms.mutable(tuple(mint.zeros(tuple(p.shape), dtype=ms.float32) for p in self.optimizer.params))
        backward = self._compiled["backward"]
        if self._draws[1]:
            self._dropout_start = seeding.get_rng_state()["dropout"]
        if self.state.pipeline_model_parallel_size == 1:
            loss_sum = 0.0
            for i, batch in enumerate(batches):
                self._dropout_at(i)
                loss, _, acc = self._timed("backward", batch, backward, acc, batch, None, None, scale)
                acc = ms.mutable(acc)
                loss_sum = loss_sum + loss  # a tensor: the host reads the loss once, at the step's end
        else:
            loss_sum, acc = self._one_f_one_b(batches, acc, scale)
        self._dropout_at(num, before=0)  # every rank leaves the step where one process would
        return self._finalize(list(acc), loss_sum / num)

    def _dropout_at(self, micro_batch: int, before: int | None = None) -> None:
        """Put the dropout generator where one process would stand at this micro-batch's forward on this stage."""
        if self._draws[1] == 0:
            return
        start = self._dropout_start
        offset = start["offset"] + micro_batch * self._draws[1] + (self._draws[0] if before is None else before)
        seeding.set_rng_state({"dropout": {"seed": start["seed"], "offset": offset}})

    def _timed(self, name: str, batch: Any, graph: Callable, *args: Any) -> Any:
        """graph(*args); its first call for each set of batch shapes (batch None: shapes that never change)
        compiles under mindspore.jit, and that call's time is printed once (train_step._announce_first_call, shared;
        norm and apply are compiled in PyNative too)."""
        if not (self.jit or name in ("norm", "apply")):
            return graph(*args)
        shapes = () if batch is None else tuple(tuple(t.shape) for t in batch[0] if t is not None)
        where = f" for batch shapes [{', '.join('x'.join(map(str, s)) for s in shapes)}]" if shapes else ""
        return _announce_first_call(
            self._compiled_shapes, (name, shapes), lambda: graph(*args), self.announce,
            lambda s: f"> MindSpore compiled the train step (parallel {_GRAPHS[name]} graph){where} in {s:.1f} s "
                      "(once; this iteration's time includes it)")

    def _one_f_one_b(self, batches: list, acc, scale) -> tuple[Any, Any]:
        """Megatron's forward_backward_pipelining_without_interleaving."""
        p2p = self._pipeline(batches[0])
        pp, pp_rank, num = self.state.pipeline_model_parallel_size, self.state.pp_rank, len(batches)
        warmup = min(pp - pp_rank - 1, num)
        pending: deque = deque()  # (micro-batch index, its input) of the forwards still to be differentiated
        loss_sum = 0.0
        backward, forward = self._compiled["backward"], self._compiled["forward"]

        def run_forward(i: int, hidden_in):
            self._dropout_at(i)
            output = self._timed("forward", batches[i], forward, batches[i], hidden_in)
            pending.append((i, hidden_in))
            return output

        def shape(i: int) -> tuple[int, int, int]:
            return self._message_shape(batches[i])

        def run_backward(output_grad):
            nonlocal acc, loss_sum
            i, hidden_in = pending.popleft()
            self._dropout_at(i)  # the recomputed forward draws the same masks as the forward did
            loss, input_grad, acc = self._timed("backward", batches[i], backward, acc, batches[i], hidden_in,
                                                output_grad, scale)
            acc = ms.mutable(acc)
            loss_sum = loss_sum + loss
            return None if self.first else input_grad

        for i in range(warmup):
            p2p.send_forward(run_forward(i, p2p.recv_forward(shape(i))))
        remaining = num - warmup
        hidden_in = p2p.recv_forward(shape(warmup)) if remaining > 0 else None
        for j in range(remaining):
            i = warmup + j
            if self.last:
                pending.append((i, hidden_in))
                output_grad = None
            else:
                # the gradient received belongs to the oldest forward still pending (run_forward appended i)
                output = run_forward(i, hidden_in)
                output_grad = p2p.send_forward_recv_backward(output, shape(pending[0][0]))
            input_grad = run_backward(output_grad)
            if j == remaining - 1:
                p2p.send_backward(input_grad)
            else:
                hidden_in = p2p.send_backward_recv_forward(input_grad, shape(i + 1))
        for _ in range(warmup):
            p2p.send_backward(run_backward(p2p.recv_backward(shape(pending[0][0]))))
        return loss_sum, acc

    def _finalize(self, grads: list, loss: Any) -> tuple[ms.Tensor, tuple[ms.Tensor, ...]]:
        """megatron-core's finalize_model_grads (data-parallel mean, sequence-parallel sums, tied embeddings);
        the loss rides in the data-parallel buffer."""
        groups = self.state.groups
        dp = self.state.data_parallel_size
        loss_t = mint.reshape(F.cast(loss if isinstance(loss, ms.Tensor) else ms.Tensor(loss), ms.float32), (1,))
        experts = self._expert_index
        if dp > 1 and experts:  # megatron-core's DDP: the experts' over their expert-data-parallel group, also 1/dp
            dense = [i for i in range(len(grads)) if i not in set(experts)]
            *summed, loss_t = _all_reduce_flat([*(grads[i] for i in dense), loss_t], groups["dp"].name, 1.0 / dp)
            summed += _all_reduce_flat([grads[i] for i in experts], self.roles.expert_data_parallel.name, 1.0 / dp)
            for i, grad in zip(dense + experts, summed):
                grads[i] = grad
        elif dp > 1:  # megatron-core's DDP: gradients scaled by 1/dp, then summed
            *grads, loss_t = _all_reduce_flat([*grads, loss_t], groups["dp"].name, 1.0 / dp)
        if self._sequence_index:
            summed = _all_reduce_flat([grads[i] for i in self._sequence_index], groups["tp"].name)
            for i, grad in zip(self._sequence_index, summed):
                grads[i] = grad
        if self._tied_index is not None:
            grads[self._tied_index] = _all_reduce_(grads[self._tied_index].copy(), groups["embd"].name)
        return mint.reshape(loss_t, ()), tuple(grads)

    def _over_model_parallel(self, squares: ms.Tensor, loss: float) -> tuple[float, float]:
        """One all-reduce over the model-parallel group: (sqrt of the summed squares, the last stage's loss)."""
        owner = self.last and self.state.tp_rank == 0  # one copy of the loss in the sum
        buffer = mint.cat([mint.reshape(squares, (1,)), ms.Tensor(np.array([loss if owner else 0.0], np.float32))])
        values = _all_reduce_(buffer, self.state.groups["mp"].name).asnumpy()
        return math.sqrt(float(values[0])), float(values[1])

    def _expert_squares(self, grads: Sequence[ms.Tensor]) -> ms.Tensor:
        """Each expert once: the squares of this rank's experts summed over the EP group (0 without experts); the
        norm's graph adds them to the dense squares before its model-parallel all-reduce."""
        if not self._expert_index:
            return ms.Tensor(0.0, ms.float32)
        own = sum((mint.sum(grads[i] * grads[i]) for i in self._expert_index), ms.Tensor(0.0, ms.float32))
        return _all_reduce_(mint.reshape(own, (1,)), self.roles.expert_parallel.name)[0]

    def _norm_and_loss(self, grads: Sequence[ms.Tensor], loss: Any) -> tuple[ms.Tensor, ms.Tensor]:
        loss = loss if isinstance(loss, ms.Tensor) else ms.Tensor(float(loss), ms.float32)
        return self._timed("norm", None, self._compiled["norm"], ms.mutable(tuple(grads)), loss,
                           self._expert_squares(grads))

    def grad_norm(self, grads: Sequence[ms.Tensor], loss: Any = 0.0) -> tuple[float, float]:
        """(global L2 norm of the finalized gradients over the model-parallel group, the last stage's `loss`
        on every rank)."""
        norm, loss = self._norm_and_loss(grads, loss)
        return float(norm), float(loss)

    def apply_gradients(self, grads: Sequence[ms.Tensor], loss: Any) -> StepResult:
        """The second half of a step: the norm over model-parallel ranks, clipping and the AdamW update of
        `grads` from compute_gradients; `loss` is what compute_gradients returned (shared with every stage).
        The norm and the loss reach the host once, after the update is under way."""
        lr = set_step_lr(self.lr_scheduler, self.optimizer)
        norm, loss = self._norm_and_loss(grads, loss)
        self._timed("apply", None, self._compiled["apply"], ms.mutable(tuple(grads)), norm,
                    self.optimizer._next_scalars())
        advance_schedule(self.lr_scheduler, self.increment, False)
        return StepResult(float(loss), float(norm), float(lr))

    def __call__(self, micro_batches: Sequence[Sequence[Any]]) -> StepResult:
        """One training step over the micro-batches: compute_gradients, then apply_gradients."""
        loss, grads = self.compute_gradients(micro_batches)
        return self.apply_gradients(grads, loss)

    def evaluate(self, micro_batches: Sequence[Sequence[Any]]) -> float:
        """The loss without gradients (forward-only schedule), mean over micro-batches and data-parallel ranks,
        on every rank."""
        batches = self._micro_batches(micro_batches)
        self.model.set_train(False)
        # Evaluation leaves the dropout generator where training left it, so an evaluation between steps
        # does not change the masks training draws next (on any split alike).
        rng = seeding.get_rng_state() if self._draws[1] else None
        try:
            loss_sum = 0.0
            p2p = self._pipeline(batches[0]) if self.state.pipeline_model_parallel_size > 1 else None
            for batch in batches:
                hidden_in = p2p.recv_forward(self._message_shape(batch)) if p2p is not None else None
                if self.last:
                    loss_sum += float(self._compiled["evaluate"](batch, hidden_in))
                else:
                    p2p.send_forward(self._compiled["forward_eval"](batch, hidden_in))
        finally:
            self.model.set_train(True)
            if rng is not None:
                seeding.set_rng_state(rng)
        loss = ms.Tensor(np.array([loss_sum / len(batches) / self.state.data_parallel_size], np.float32))
        _all_reduce_(loss, self.state.groups["dp"].name)
        return self._over_model_parallel(ms.Tensor(0.0, ms.float32), float(loss.asnumpy()[0]))[1]
