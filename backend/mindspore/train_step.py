"""One training step on the mindspore backend: forward, backward, all-reduce, clip, update.

Same public names and contract as `mmrun.backend.torch.train_step` (see there):

    step = TrainStep(model, optimizer, loss_fn=gpt_loss, lr_scheduler=schedule, clip_grad=1.0)
    result = step([(tokens, labels, loss_mask), ...])   # one tuple per micro-batch
    result.loss, result.grad_norm, result.lr             # floats

With `jit=True` (the default, `DEFAULT_JIT`) the step is compiled with `mindspore.jit`: with one micro-batch,
one graph for forward, backward, the data-parallel all-reduce, clipping and the AdamW update; with several, one
graph run once per micro-batch that adds its loss and gradients to the running sums (zeros for the first), and
one for the all-reduce, clipping and the update. Inside those graphs the gradients travel as flat fp32 buckets
(`BUCKET_ELEMENTS`, Megatron's DDP bucket size): one collective per bucket (the loss rides in the last), the norm
and the clipping as one kernel each per bucket rather than four per parameter; on CPU the cost of a step this size
is per kernel (docs/multimodal.md, Speed).
The first call for each new set of batch shapes compiles, and its time is printed once (`announce`). With `jit=False` forward and backward
run eagerly (PyNative) and only the update graph is compiled. The first call compiles (seconds); a
new batch shape compiles again.

Mixed precision and loss scaling as on torch (see there). With a `grad_scaler` the step always takes
the split path: the host must see whether the gradients overflowed before the update graph runs. The
scale enters the graphs as a tensor, so a new scale does not recompile them.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import mindspore as ms
from mindspore import Tensor, mint
from mindspore import ops as _ops
from mindspore.ops import functional as F

from mmrun.backend.grad_scaler import ConstantGradScaler
from mmrun.precision.timers import NO_TIMERS
from mmrun.backend.mindspore import device, optim
from mmrun.common.heap_trim import trimmed_heap
from mmrun.backend.train_step_shared import (  # noqa: F401 - StepResult is part of this module's API
    LocalGradients, StepResult, advance_schedule, call_model, check_micro_batches, local_indices, set_step_lr,
    world_size)

# Measured (docs/parity.md, docs/portable-api.md): jit gives the same losses as PyNative and is several
# times faster per step; the one-off compile (5 to 25 s on CPU) pays off within a few dozen steps.
DEFAULT_JIT = True
# Gradients per flat bucket in the compiled update (elements; megatron-core's DDP default, 40M): a bucket is one
# concatenation, one collective, one norm and one clipping kernel, and bounds the extra memory of the copy.
BUCKET_ELEMENTS = 40_000_000
# ... and at most this many tensors: the graph splits a bucket back into its tensors with one nested call per
# tensor, and MindSpore's compiler stops at a call depth of 1000 ("Exceed function call depth limit"): a bucket of
# 400 small tensors (a 24-layer GPT of hidden 128) failed to compile, 200 compiled.
BUCKET_TENSORS = 128


def _announce_first_call(seen: set, key: Any, run: Callable[[], Any], announce: Callable[[str], None] | None,
                        line: Callable[[float], str]) -> Any:
    """run(); the first call for `key` (not yet in `seen`) compiles a mindspore.jit graph: it is waited for and
    `line(seconds)` goes to `announce`, once, so the first iteration's time is read as compilation. Shared by
    TrainStep and the parallel engine's ParallelTrainStep."""
    if key in seen:
        return run()
    start = time.perf_counter()
    with trimmed_heap():  # the compile's freed heap back to the system before the pool fills (heap_trim.py)
        out = run()
        # wait for the run (mindspore.runtime.synchronize has no CPU device): read the first tensor it returned
        first = next((v for v in (out if isinstance(out, tuple) else (out,)) if isinstance(v, Tensor)), None)
        if first is not None:
            first.asnumpy()
    seen.add(key)
    if announce is not None:
        announce(line(time.perf_counter() - start))
    return out


def _all_reduce_mean(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Tensors averaged over ranks, with one collective on a flat buffer, eagerly: the loss-scaling path only,
    whose host must see the reduced gradients' norm before the update (without a scaler the all-reduce is inside
    the compiled update, `TrainStep._update`)."""
    from mmrun.backend.mindspore import distributed
    flat = mint.cat([mint.reshape(t, (-1,)) for t in tensors])
    flat = distributed.all_reduce(flat, op="mean")
    pieces = mint.split(flat, [int(t.size) for t in tensors])
    return [mint.reshape(p, t.shape) for p, t in zip(pieces, tensors)]


def _bucket_ranges(sizes: Sequence[int], limit: int = BUCKET_ELEMENTS,
                   tensors: int = BUCKET_TENSORS) -> tuple[tuple[int, int], ...]:
    """[start, end) parameter ranges, in order, of at most `limit` elements (a larger tensor alone) and at most
    `tensors` tensors each."""
    ranges, start, filled = [], 0, 0
    for i, size in enumerate(sizes):
        if i > start and (filled + size > limit or i - start == tensors):
            ranges.append((start, i))
            start, filled = i, 0
        filled += size
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return tuple(ranges)


def _split_flat(flat: Tensor, sizes: Sequence[int], most: int = BUCKET_TENSORS) -> list[Tensor]:
    """mint.split(flat, sizes) inside a graph, in groups of at most `most` pieces (see BUCKET_TENSORS): a flat buffer
    of every parameter (the distributed optimizer's) is first cut into groups, then each group into its pieces."""
    sizes = [int(size) for size in sizes]
    if len(sizes) <= most:
        return list(mint.split(flat, sizes))
    groups = [sizes[i:i + most] for i in range(0, len(sizes), most)]
    pieces = []  # loops, not one nested comprehension: MindSpore's graph parser takes one `for` per comprehension
    for group, part in zip(groups, mint.split(flat, [sum(g) for g in groups])):
        pieces += list(mint.split(part, group))
    return pieces


def _fp32(grads: Sequence[Tensor]) -> tuple[Tensor, ...]:
    # fp16/bf16 gradients are summed, reduced and applied in fp32 (the optimizer keeps fp32 main params);
    # dtypes are compile-time constants, so fp32 graphs get no cast.
    return tuple([g if g.dtype == ms.float32 else F.cast(g, ms.float32) for g in grads])


def _batch(micro_batch: Sequence[Any]) -> Any:
    # mutable: tensors inside a tuple argument are otherwise jit constants, recompiled on every new value.
    return ms.mutable(tuple(micro_batch))


class TrainStep(ms.nn.Cell):
    def __init__(self, model: ms.nn.Cell, optimizer: optim.AdamW, loss_fn: Callable[..., Any] | None = None,
                 lr_scheduler: Any = None, clip_grad: float = 1.0, increment: int = 1, jit: bool | None = None,
                 grad_scaler: ConstantGradScaler | None = None, local_grads: LocalGradients | None = None) -> None:
        # auto_prefix=False: holding the model must not rename its parameters to `model.*`.
        super().__init__(auto_prefix=False)
        self.model, self.optimizer = model, optimizer
        self.loss_fn = loss_fn or call_model
        self.clip_grad = float(clip_grad)
        self.lr_scheduler, self.increment = lr_scheduler, increment
        self.jit = DEFAULT_JIT if jit is None else bool(jit)
        self.world_size: int | None = None  # asked on the first step, after the launcher set up ranks
        self.grad_scaler = grad_scaler
        # expert parallelism's experts (train_step_shared.LocalGradients): reduced eagerly, on the scaler's path
        self.local_grads = local_grads
        self.timers = NO_TIMERS  # per-phase timers (mmrun.precision.timers), set by the engine when asked for
        self.announce: Callable[[str], None] | None = None  # prints the compile time of each new batch shape
        self._compiled_shapes: set = set()
        self._zeros: tuple | None = None  # (loss, gradients) accumulators of a step's first micro-batch
        self._grad_fn = ms.value_and_grad(self._loss, None, optimizer.params)
        self._scaled_grad_fn = ms.value_and_grad(self._scaled_loss, None, optimizer.params, has_aux=True)
        wrap = ms.jit if self.jit else (lambda fn: fn)
        # The update (clip + AdamW) is compiled even with jit=False: it has no user code to debug, and in
        # PyNative its ~4 small ops per parameter cost more than the graph (measured in docs/portable-api.md).
        self._shapes = tuple(tuple(p.shape) for p in optimizer.params)
        self._buckets = _bucket_ranges([math.prod(shape) for shape in self._shapes])
        self._all_reduce = None  # ops.AllReduce, made on the first step with 2+ ranks (it needs communication)
        # ... except PyNative on a CPU: there the update graph's kernels keep ~80 MiB a GPT layer outside the pool
        # for the whole run (half of PyNative's memory outside it; benchmarks/ms_step_memory.py), and eager it
        # computes the same losses (docs/memory-and-speed.md: recomputation's peak ratio there).
        eager_update = not self.jit and device.detect().kind == "cpu"
        self._compiled = {"fused": wrap(self._fused_step), "grads": wrap(self._grads),
                          "accumulate": wrap(self._accumulate), "sum_into": wrap(self._sum_into),
                          "update": self._update if eager_update else ms.jit(self._update),
                          "unscale": ms.jit(self._unscale), "apply": ms.jit(self._apply)}

    def _loss(self, *batch):
        return self.loss_fn(self.model, *batch)

    def _scaled_loss(self, scale, *batch):
        # Differentiate loss x scale; the loss itself rides along as aux, undifferentiated.
        loss = self.loss_fn(self.model, *batch)
        return loss * scale, loss

    def _grads(self, batch, scale):
        (_, loss), grads = self._scaled_grad_fn(scale, *batch)
        return loss, _fp32(grads)

    def _accumulate(self, acc, batch, scale):
        (_, loss), grads = self._scaled_grad_fn(scale, *batch)
        return loss, tuple([a + g for a, g in zip(acc, _fp32(grads))])

    def _sum_into(self, acc, loss_acc, batch, scale):
        # The loss is summed inside the graph too: a compiled graph may reuse its output buffers on its next call.
        (_, loss), grads = self._scaled_grad_fn(scale, *batch)
        return loss_acc + loss, tuple([a + g for a, g in zip(acc, _fp32(grads))])


    def _unscale(self, grads, factor):
        grads = tuple([g * factor for g in grads])
        return grads, optim.global_norm(grads)

    def _apply(self, grads, norm, scalars):
        grads, norm = optim.clip_grad_norm(grads, self.clip_grad, total=norm)
        return F.depend(norm, self.optimizer(grads, scalars))

    def _update(self, grads, loss, scalars):
        """The all-reduce (2+ ranks), clipping and AdamW on the summed gradients; returns [loss, norm].
        ops.reshape, not mint.reshape: MindSpore warns about the latter's view semantics in every graph using it."""
        buckets = [mint.cat([_ops.reshape(grads[i], (-1,)) for i in range(a, b)]) for a, b in self._buckets]
        if self._all_reduce is not None:
            # The loss rides at the end of the last bucket: one collective per bucket, none of its own.
            last, n = buckets[-1], buckets[-1].shape[0]
            last = self._all_reduce(mint.cat([last, _ops.reshape(loss, (1,))])) / self.world_size
            buckets = [self._all_reduce(bucket) / self.world_size for bucket in buckets[:-1]] + [last[:n]]
            loss = last[n:]
        squares = [mint.sum(bucket * bucket) for bucket in buckets]
        norm = mint.sqrt(squares[0] if len(squares) == 1 else _ops.addn(squares))
        if self.clip_grad > 0:  # torch's clip_grad_norm_: scale by max_norm / (norm + 1e-6), never up
            coef = mint.clamp(self.clip_grad / (norm + 1e-6), max=1.0)
            buckets = [bucket * coef for bucket in buckets]
        clipped = []
        for (a, b), bucket in zip(self._buckets, buckets):
            pieces = mint.split(bucket, [math.prod(self._shapes[i]) for i in range(a, b)])
            clipped += [_ops.reshape(piece, self._shapes[i]) for piece, i in zip(pieces, range(a, b))]
        # mutable: when this runs eagerly (PyNative on a CPU) AdamW's own jit would otherwise take the gradients as
        # constants, compile again every step and log a warning printing every gradient tensor.
        done = self.optimizer(ms.mutable(tuple(clipped)), scalars)
        # One tensor back to the host: a step reads its loss and norm together.
        return F.depend(mint.cat([_ops.reshape(loss, (1,)), _ops.reshape(norm, (1,))]), done)

    def _fused_step(self, batch, scalars):
        loss, grads = self._grad_fn(*batch)
        return self._update(_fp32(grads), loss, scalars)

    def __call__(self, micro_batches: Sequence[Sequence[Any]]) -> StepResult:
        check_micro_batches(micro_batches)
        if self.world_size is None:
            self.world_size = world_size("mmrun.backend.mindspore")
            if self.world_size > 1:
                self._all_reduce = _ops.AllReduce()
        lr = set_step_lr(self.lr_scheduler, self.optimizer)
        num_micro = len(micro_batches)
        timers = self.timers
        split = self.grad_scaler is not None or (self.local_grads is not None and self.world_size > 1)
        if not split and self.jit and num_micro == 1:
            # One compiled graph: the all-reduce's and the optimizer's time are inside forward-backward here.
            with timers.phase("forward-backward"):
                loss_norm = self._announce_compile("fused", micro_batches[0], self.optimizer._next_scalars())
            return self._finish_pair(loss_norm, lr)
        scale = self.grad_scaler.scale if self.grad_scaler is not None else 1.0
        # Each micro-batch loss is divided by their number, then scaled (Megatron's order, and torch's here).
        scale_t = Tensor(scale / num_micro, ms.float32)
        with timers.phase("forward-backward"):
            if self.jit:
                # One graph for every micro-batch, the first adding its gradients to zeros (exact): a second
                # forward-backward graph for the first micro-batch cost as much compile time again.
                loss, grads = self._zero_grads()
                for batch in micro_batches:
                    loss, grads = self._announce_compile("sum_into", batch, (ms.mutable(grads), loss, scale_t))
            else:
                loss, grads = self._compiled["grads"](_batch(micro_batches[0]), scale_t)
                for batch in micro_batches[1:]:
                    micro_loss, grads = self._compiled["accumulate"](ms.mutable(tuple(grads)), _batch(batch), scale_t)
                    loss = loss + micro_loss
            loss = loss / num_micro
        if not split:
            # The data-parallel all-reduce is inside the update graph (see _update).
            with timers.phase("optimizer"):
                what = "gradient all-reduce, clipping and AdamW" if self._all_reduce is not None else \
                    "clipping and AdamW"
                loss_norm = self._announce_once("update", what, lambda: self._compiled["update"](
                    ms.mutable(tuple(grads)), loss, self.optimizer._next_scalars()))
            return self._finish_pair(loss_norm, lr)
        if self.world_size > 1:
            with timers.phase("grads-all-reduce"):
                if self.local_grads is None:
                    *grads, loss = _all_reduce_mean(list(grads) + [loss])
                else:
                    grads, loss = self._reduce_with_local(list(grads), loss)
        factor = Tensor(1.0 / scale, ms.float32)
        with timers.phase("optimizer"):
            grads, norm = self._compiled["unscale"](ms.mutable(tuple(grads)), factor)
            if self.local_grads is not None and self.world_size > 1:
                norm = self._norm_with_local(grads)
            norm_value = float(norm)
            skipped = not math.isfinite(norm_value)  # one inf/nan anywhere makes the global norm non-finite
            if self.grad_scaler is not None:
                self.grad_scaler.update(skipped)
            if not skipped:
                self._compiled["apply"](ms.mutable(tuple(grads)), norm, self.optimizer._next_scalars())
        return self._finish(loss, norm_value, lr, skipped, scale if self.grad_scaler is not None else None)

    def _reduce_with_local(self, grads: list, loss: Tensor) -> tuple[list, Tensor]:
        """Replicated gradients (and the loss) averaged over every rank; the local ones (LocalGradients) summed
        over their group and divided by the world size (eagerly, as the scaler's path does)."""
        from mmrun.backend.mindspore import distributed

        replicated, local = local_indices(self.optimizer.names, self.local_grads)
        *reduced, loss = _all_reduce_mean([grads[i] for i in replicated] + [loss])
        for i, g in zip(replicated, reduced):
            grads[i] = g
        if local:
            flat = mint.cat([mint.reshape(grads[i], (-1,)) for i in local])
            flat = distributed.group_all_reduce(flat, self.local_grads.group) / self.world_size
            for i, piece in zip(local, mint.split(flat, [int(grads[i].size) for i in local])):
                grads[i] = mint.reshape(piece, grads[i].shape)
        return grads, loss

    def _norm_with_local(self, grads: Sequence[Tensor]) -> Tensor:
        """The global L2 norm when some parameters are local: each expert's squares counted once over the world."""
        from mmrun.backend.mindspore import distributed

        replicated, local = local_indices(self.optimizer.names, self.local_grads)
        squares = [sum(float(mint.sum(grads[i] * grads[i])) for i in indices) for indices in (replicated, local)]
        held = distributed.all_reduce(Tensor([squares[1]], ms.float32), op="sum").asnumpy()[0]
        return Tensor(math.sqrt(squares[0] + float(held) / self.local_grads.replicas), ms.float32)

    def _zero_grads(self) -> tuple[Tensor, ...]:
        if self._zeros is None:
            self._zeros = (Tensor(0.0, ms.float32),
                           tuple(mint.zeros(p.shape, dtype=ms.float32) for p in self.optimizer.params))
        return self._zeros

    def _run(self, name, micro_batch, extra):
        if name == "sum_into":
            acc, loss, scale = extra
            return self._compiled[name](acc, loss, _batch(micro_batch), scale)
        return self._compiled[name](_batch(micro_batch), extra)

    def _announce_compile(self, name, micro_batch, extra):
        """Run the compiled graph `name` on a micro-batch; the first call of each set of batch shapes compiles
        it, and that call's time is printed once, as compilation, so a reader does not take it for a step."""
        key = (name,) + tuple(tuple(t.shape) if hasattr(t, "shape") else None for t in micro_batch)
        shapes = ", ".join("x".join(map(str, k)) for k in key[1:] if k is not None)
        return _announce_first_call(
            self._compiled_shapes, key, lambda: self._run(name, micro_batch, extra), self.announce,
            lambda s: f"> MindSpore compiled the train step ({name} graph) for batch shapes [{shapes}] in {s:.1f} s "
                      "(once per shape; this iteration's time includes it)")

    def _announce_once(self, name, what, run):
        """`run()` of a graph whose shapes never change (the update: clipping and AdamW); its first call
        compiles, and that time is printed once too, so the first iteration's time is all accounted for."""
        return _announce_first_call(
            self._compiled_shapes, name, run, self.announce,
            lambda s: f"> MindSpore compiled the train step ({name} graph: {what}) in {s:.1f} s "
                      "(once; this iteration's time includes it)")

    def _finish_pair(self, loss_norm: Tensor, lr: float) -> StepResult:
        loss, norm = (float(v) for v in loss_norm.asnumpy())
        return self._finish(loss, norm, lr)

    def _finish(self, loss: Tensor, norm: float, lr: float, skipped: bool = False,
                scale: float | None = None) -> StepResult:
        advance_schedule(self.lr_scheduler, self.increment, skipped)
        return StepResult(float(loss), norm, float(lr), skipped, scale)
