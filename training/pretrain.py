"""The shared training loop: Megatron's `pretrain()`, driving an entry script's five callbacks.

    pretrain(train_valid_test_datasets_provider, model_provider, ModelType.encoder_or_decoder, forward_step)

In order (the call flow of Megatron-LM's megatron/training/training.py, as MindSpeed-MM's model migration
guide, MindSpeed MM模型迁移指南 "核心接口调用流程", draws it): parse and check the arguments, gate the features for this
framework and device, pick the engine (engines/: mmrun's own for data parallelism on both
frameworks, megatron-core on PyTorch for tensor, pipeline, context parallelism and the distributed
optimizer), start communication and the engine's parallel state, build the tokenizer, seed,
`model_provider()` -> model (per pipeline stage), the optimizer + Megatron's LR schedule, `--load`,
`train_valid_test_datasets_provider(num_samples)` -> datasets (or ready-made loaders), then per iteration
the engine's step over the micro-batches: `forward_step(data_iterator, model)` calls `get_batch` and
returns `(output_tensor, partial(loss_func, loss_mask))`. Validation every --eval-interval, checkpoints
every --save-interval, and a final validation and test loss.

What the loop owns and what the engine owns: engines/base.py. With mmrun's engine the
callbacks meet the framework's autograd through engines/forward_plan.py (forward_step is recorded,
then replayed inside the train step); on MindSpore the step is compiled with mindspore.jit unless
--no-ms-jit is given (or forward_step returns a closure: then PyNative, with one notice).

Placement: the model is moved to this process's device right after model_provider(), before its
optimizer exists, so parameters, gradients and optimizer state all live on the NPU/GPU; batches arrive
there through `tensors.from_numpy` (pinned memory, non-blocking copies).
"""
from __future__ import annotations

import argparse
import enum
import math
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from mmrun import engines
from mmrun.training import checkpointing, global_vars, parallel
from mmrun.training.arguments import ArgumentsError, ModelSource, parse_args
from mmrun.engines.base import Engine, ParallelLayout, TrainingError
from mmrun.precision import determinism
from mmrun.precision.monitor import MonitorError, RunMonitor
from mmrun.precision.training_probe import AnomalyStop, TrainingProbe
from mmrun.training.training_log import IntervalStats, MetricsFile, iteration_line, stamp, validation_block


class ModelType(enum.Enum):
    """Megatron's model types; mmrun trains decoder-only models (the argument is accepted for compatibility)."""

    encoder_or_decoder = 1


@dataclass
class TrainingResult:
    """What `pretrain()` returns (Megatron's returns nothing; tests and benchmarks use this)."""

    framework: str
    iteration: int
    losses: dict[int, float] = field(default_factory=dict)  # iteration -> lm loss
    grad_norms: dict[int, float] = field(default_factory=dict)
    validation: list[tuple[str, float]] = field(default_factory=list)
    test_loss: float | None = None
    step_times: list[float] = field(default_factory=list)  # seconds per iteration
    peak_rss_mb: float = 0.0  # this process's peak resident memory
    peak_device_memory_mb: float | None = None  # peak tensor memory on the GPU/NPU; None on CPU


# ------------------------------------------------------------------------------------ the loop

def _usage_exit(message: str, rank: int, code: int = 2) -> None:
    from mmrun.backend import rank_env

    info = rank_env.read_rank_info()
    if rank == 0 and info.rank == 0:  # every rank finds the same error: say it once
        print(f"error: {message}", file=sys.stderr, flush=True)
    elif info.world_size > 1:
        # torchrun / msrun stop the whole job at the first exit: the other ranks leave a moment later, so that
        # rank 0 (maybe descheduled on a busy machine) is not stopped before its line is out.
        time.sleep(USAGE_EXIT_GRACE_S)
    raise SystemExit(code)


USAGE_EXIT_GRACE_S = 2.0


def _build_loader(dataset: Any, consumed: int, args: argparse.Namespace, layout: ParallelLayout) -> Any:
    """A Megatron dataset -> the sequential data-parallel loader; a ready-made loader/iterable is kept."""
    if dataset is None:
        return None
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        from mmrun.data.samplers import build_pretraining_data_loader

        if consumed >= len(dataset):
            return None  # a run resumed at its end: nothing of this split is left to read

        return build_pretraining_data_loader(dataset, consumed, args.micro_batch_size, layout.dp_rank, layout.dp,
                                             num_workers=args.num_workers)
    return dataset  # MindSpeed-MM style (its migration guide's providers): the provider returned data loaders


def _iterators(loader: Any, layout: ParallelLayout) -> list[Iterator] | None:
    """One iterator per model chunk (virtual pipeline stage), each over the same samples, as Megatron builds them."""
    if loader is None:
        return None
    if layout.model_chunks == 1:
        return [iter(loader)]
    iterators = [iter(loader) for _ in range(layout.model_chunks)]
    if iterators[0] is iterators[1]:
        raise TrainingError("virtual pipeline stages read each split once per model chunk, so "
                            "train_valid_test_datasets_provider must return datasets or re-iterable loaders. "
                            f"Received: {type(loader).__name__}, an iterator")
    return iterators


def _peak_rss_mb() -> float:
    """This process's peak resident set size (what a CPU run has instead of device memory)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def pretrain(train_valid_test_datasets_provider: Callable, model_provider: Callable,
             model_type: ModelType | None = None, forward_step_func: Callable | None = None, *,
             args_defaults: dict[str, Any] | None = None, extra_args_provider: Callable | None = None,
             argv: Sequence[str] | None = None, model_source: ModelSource | None = None) -> TrainingResult:
    """Megatron's pretrain(): build everything from the arguments (sys.argv by default) and train.

    `model_source`: the entry builds its model from a file (MindSpeed-MM's --mm-model), whose sizes replace
    the network-size flags (training/arguments.py, ModelSource).

    Usage errors (bad arguments, unsupported features, a checkpoint that does not fit) print one line on
    rank 0 and raise SystemExit(2).
    """
    from mmrun.backend.errors import BackendError
    from mmrun.data.gpt_dataset import DatasetConfigError
    from mmrun.data.indexed_dataset import IndexedDatasetError
    from mmrun.data.tokenizers import TokenizerError
    from mmrun.precision.dump_config import DumpConfigError

    if forward_step_func is None:
        raise TypeError("pretrain() needs forward_step_func (Megatron's 4th argument)")
    rank = 0
    try:
        args = parse_args(argv, args_defaults=args_defaults, extra_args_provider=extra_args_provider,
                          model_source=model_source)
        rank = args.rank
        return _pretrain(args, train_valid_test_datasets_provider, model_provider, forward_step_func)
    except (ArgumentsError, checkpointing.CheckpointError, DatasetConfigError, IndexedDatasetError,
            TokenizerError, DumpConfigError, MonitorError) as err:
        _usage_exit(str(err), rank, getattr(err, "exit_code", 2))  # a failed checkpoint save is a runtime error (1)
    except (TrainingError, AnomalyStop) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except BackendError as err:
        if getattr(err, "exit_code", 1) != 2:
            raise
        _usage_exit(str(err), rank)
    raise AssertionError("unreachable")


def _gate(args: argparse.Namespace) -> tuple[str, str]:
    """The feature gate, right after parsing and before any model exists (exit 2 on refusal).

    It checks both layers of the feature table: what the framework stack can do on this device, and
    what mmrun's trainer implements; each printed line names its layer.
    """
    from mmrun import backend
    from mmrun.features import FeatureGateError, gate

    if args.ai_framework is not None:
        backend.select(args.ai_framework, source=f"--ai-framework {args.ai_framework} in the training arguments")
    framework = backend.framework()
    package = backend.load()
    device = package.device.detect().kind
    try:
        result = gate(args, framework, device, args.on_unsupported, framework_version=package.version(),
                      stream=sys.stderr if args.rank == 0 else None,
                      entry_features=getattr(args, "entry_features", ()))
    except FeatureGateError as err:
        if args.rank == 0:
            for line in err.lines:
                print(f"error: {line}", file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None
    result.apply(args)
    args.ai_framework = framework
    # MindSpeed's fused-kernel flags, as the gate left them (off where only the unfused math runs).
    backend.kernels.use_fused(rms_norm=getattr(args, "use_fused_rmsnorm", False),
                              swiglu=getattr(args, "use_fused_swiglu", False),
                              rotary=getattr(args, "use_fused_rotary_pos_emb", False))
    return framework, device


@dataclass
class _Job:
    """What the phases of one run share (Megatron keeps these in globals)."""

    args: argparse.Namespace
    framework: str
    rank: int
    engine: Engine
    layout: ParallelLayout = field(default_factory=ParallelLayout)
    scheduler: Any = None
    progress: checkpointing.TrainingProgress = field(default_factory=checkpointing.TrainingProgress)
    metrics: MetricsFile | None = None
    result: TrainingResult | None = None
    probe: TrainingProbe | None = None  # --dump-config, --anomaly-detection (mmrun.precision)
    monitor: RunMonitor | None = None  # TensorBoard/W&B, throughput, timers, --profile (mmrun.precision)

    def log(self, message: str) -> None:
        if self.rank == 0:
            print(message, flush=True)

    @property
    def model(self) -> Any:
        """mmrun's engine: the model; megatron-core's: its wrapped model chunks."""
        return getattr(self.engine, "model", None) or getattr(self.engine, "chunks", None)

    @property
    def optimizer(self) -> Any:
        return self.engine.optimizer


def _pretrain(args: argparse.Namespace, datasets_provider: Callable, model_provider: Callable,
              forward_step_func: Callable) -> TrainingResult:
    checkpointing.check_save_dir(args.save)  # an unwritable --save stops now, not at the first save
    job = initialize(args)
    setup_model_and_optimizer(job, model_provider)
    iterators = build_train_valid_test_data_iterators(job, datasets_provider)
    job.metrics = MetricsFile(args.metrics_file, enabled=job.rank == 0)
    job.result = TrainingResult(framework=job.framework, iteration=job.progress.iteration)
    job.probe = TrainingProbe.create(args, job.framework, job.rank, job.model, job.log)
    job.monitor = RunMonitor.create(args, job.framework, job.rank, job.engine, job.log, job.progress.iteration)
    try:
        train(job, forward_step_func, *iterators)
    finally:
        job.metrics.close()
        job.monitor.close()
        if job.probe is not None:
            job.probe.close()
    return job.result


def initialize(args: argparse.Namespace) -> _Job:
    """Megatron's initialize_megatron: feature gate, engine, communication and parallel state, tokenizer, seeds."""
    from mmrun import backend
    from mmrun.data.tokenizers import build_tokenizer, padded_vocab_size

    framework, device = _gate(args)
    rank = backend.rank_env.read_rank_info().rank
    say = (lambda message: print(message, flush=True)) if rank == 0 else (lambda message: None)
    engine = engines.create(args, framework, say)
    determinism.apply(args, framework, say)  # before communication starts (HCCL reads its switch then)
    engines.start_process_group(args, framework)
    info = backend.init_distributed(args.distributed_backend)
    if info.world_size != args.world_size:
        raise TrainingError(f"the launcher reports {info.world_size} processes but the arguments were checked for "
                            f"{args.world_size}; start the job through mmrun, torchrun or msrun")
    args.rank = info.rank
    job = _Job(args=args, framework=framework, rank=info.rank, engine=engine)
    job.log(f"> setting random seeds to {args.seed} ...")
    backend.seeding.seed_everything(args.seed)
    job.layout = engine.initialize(args)  # after the common seeds: an engine may derive its own from them
    parallel.set_layout(job.layout)
    tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file, args.vocab_size,
                                args.tokenizer_model)
    # A multiple of --make-vocab-size-divisible-by that the tensor-parallel ranks split evenly. Megatron pads to
    # divisible-by x TP instead, which changes the network with the TP size; this keeps one network for all.
    args.padded_vocab_size = padded_vocab_size(
        tokenizer.vocab_size, math.lcm(args.make_vocab_size_divisible_by, args.tensor_model_parallel_size))
    global_vars.set_global_variables(args, tokenizer)
    job.log(f"> mmrun pretrain: {framework} {backend.load().version()} on {device}, world size {info.world_size} "
            f"({job.layout.describe()}), engine {engine.name}, {args.num_micro_batches} micro-batch(es) of "
            f"{args.micro_batch_size} per step, global batch size {args.global_batch_size}")
    if getattr(args, "model_source", None):  # the model file gives the vocabulary (and the data its tokenizer)
        if args.vocab_size > 1:  # a model without a vocabulary (a video DiT) says 1
            job.log(f" > vocabulary of {args.vocab_size} rows, from {args.model_source}")
    else:
        job.log(f" > padded vocab (size: {tokenizer.vocab_size}) with {args.padded_vocab_size - tokenizer.vocab_size} "
                f"dummy tokens (new size: {args.padded_vocab_size})")
    return job


def setup_model_and_optimizer(job: _Job, model_provider: Callable) -> None:
    """Megatron's LR schedule, then the engine builds model_provider()'s model (cast to --fp16/--bf16) and
    its optimizer (AdamW with Megatron's no-decay rule, fp32 main params, the loss scaler), then --load."""
    from mmrun.backend.lr_schedule import LRSchedule

    args = job.args
    try:
        job.scheduler = LRSchedule.from_iterations(
            args.lr, args.train_iters, min_lr=args.min_lr, lr_decay_style=args.lr_decay_style,
            lr_decay_iters=args.lr_decay_iters, lr_warmup_iters=args.lr_warmup_iters,
            lr_warmup_fraction=args.lr_warmup_fraction, lr_warmup_init=args.lr_warmup_init,
            global_batch_size=args.global_batch_size)
    except ValueError as err:
        raise ArgumentsError(f"{err}. Received: --lr-warmup-iters {args.lr_warmup_iters}, --lr-warmup-fraction "
                             f"{args.lr_warmup_fraction}, --lr-decay-iters {args.lr_decay_iters}") from None
    job.engine.build(model_provider, job.scheduler)
    layout = job.layout
    job.log(f" > number of parameters on (tensor, pipeline) model parallel rank ({layout.tp_rank}, "
            f"{layout.pp_rank}): {job.engine.parameter_count()}, on {job.engine.device()}")
    if args.load:
        job.progress = checkpointing.load_checkpoint(args, job.engine, job.scheduler, log=job.log)
    job.log(f"[after model, optimizer, and learning rate scheduler are built] datetime: {stamp()}")


def build_train_valid_test_data_iterators(job: _Job, datasets_provider: Callable) -> tuple:
    """The datasets from the provider, wrapped in data-parallel loaders that start at the consumed
    samples; returns (train iterators, valid iterators, test loader), None where a split is empty (one
    iterator per model chunk: more than one with virtual pipeline stages)."""
    from mmrun.data.gpt_dataset import train_valid_test_num_samples

    args, progress = job.args, job.progress
    job.log("> building train, validation, and test datasets ...")
    num_samples = train_valid_test_num_samples(args.train_iters, args.global_batch_size, args.eval_interval,
                                               args.eval_iters)
    job.log(" > datasets target sizes (minimum size):\n"
            f"    train:      {num_samples[0]}\n    validation: {num_samples[1]}\n    test:       {num_samples[2]}")
    train_ds, valid_ds, test_ds = datasets_provider(num_samples)
    layout = job.layout
    train_loader = _build_loader(train_ds, progress.consumed_train_samples, args, layout)
    valid_loader = _build_loader(valid_ds, progress.consumed_valid_samples, args, layout)
    test_loader = _build_loader(test_ds, 0, args, layout)
    if train_loader is None and progress.iteration < args.train_iters:
        raise TrainingError("train_valid_test_datasets_provider returned no training dataset; give the train "
                            "split a weight in --split")
    job.log(f"[after dataloaders are built] datetime: {stamp()}")
    return _iterators(train_loader, layout), _iterators(valid_loader, layout), test_loader


def _evaluate_and_print(job: _Job, forward_step_func: Callable, prefix: str, iterators: Sequence[Iterator],
                        kind: str) -> float | None:
    args = job.args
    try:
        losses = job.engine.evaluate(forward_step_func, iterators, args.eval_iters)
    except StopIteration:
        raise TrainingError("the validation/test data ran out during evaluation; use more data, a larger "
                            "valid/test --split weight, or fewer --eval-iters") from None
    if kind == "valid":
        job.progress.consumed_valid_samples += args.eval_iters * args.global_batch_size
    job.log(validation_block(prefix, losses))
    job.monitor.after_eval(kind, job.progress.iteration, losses, job.progress.consumed_train_samples)
    job.metrics.write({"kind": kind, "iteration": job.progress.iteration, **losses})
    loss = losses.get("lm loss")
    if kind == "test":
        job.result.test_loss = loss
    else:
        job.result.validation.append((prefix, loss))
    return loss


def _heartbeat_function() -> Callable[[], None]:
    """The launcher's per-iteration sign of life (mmrun.launchers.heartbeat; a no-op outside an mmrun job).
    A launcher without it (an older mmrun) leaves nothing to tell."""
    try:
        from mmrun.launchers.heartbeat import heartbeat
    except ImportError:
        return lambda: None
    return heartbeat


_heartbeat = _heartbeat_function()


def train(job: _Job, forward_step_func: Callable, train_iters: Sequence[Iterator] | None,
          valid_iters: Sequence[Iterator] | None, test_loader: Any) -> None:
    """Megatron's train(): steps, logs, evaluations, saves, exits; then the final validation and test."""
    from mmrun import backend

    args, progress, result = job.args, job.progress, job.result
    do_valid = valid_iters is not None and args.eval_iters > 0
    last_saved = progress.iteration if args.load else None

    def save() -> None:
        nonlocal last_saved
        if last_saved != progress.iteration:
            checkpointing.save_checkpoint(args, progress, job.engine, job.scheduler, log=job.log)
            last_saved = progress.iteration

    if progress.iteration >= args.train_iters:
        job.log(f"> nothing to train: the checkpoint loaded from {args.load} is at iteration {progress.iteration}, "
                f"--train-iters is {args.train_iters}; only validation and test follow (raise --train-iters to go "
                "on, or give another --save/--load to start over)")
    job.log("training ...")
    job.log(f"[before the start of training step] datetime: {stamp()}")
    stats = IntervalStats()
    wall_start = time.time()
    exited_early = False
    while progress.iteration < args.train_iters:
        if job.probe is not None:
            job.probe.before_step(progress.iteration + 1)
        job.monitor.before_step(progress.iteration + 1)
        start, cpu_start = time.perf_counter(), time.process_time()
        try:
            out = job.engine.train_step(forward_step_func, train_iters)
        except StopIteration:
            raise TrainingError(f"the training data ran out at iteration {progress.iteration + 1}; use more data "
                                "or fewer --train-iters") from None
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        _heartbeat()  # tells `mmrun --watchdog-seconds N` that this rank lives, also between log lines
        progress.iteration += 1
        progress.consumed_train_samples += args.global_batch_size
        it = result.iteration = progress.iteration
        result.losses[it], result.grad_norms[it] = out.loss, out.grad_norm
        result.step_times.append(elapsed)
        stats.add({"lm loss": out.loss}, elapsed, skipped=out.skipped)
        if job.probe is not None:
            job.probe.after_step(it, out.loss, None if out.skipped else out.grad_norm)
        job.monitor.after_step(it, out, elapsed, progress.consumed_train_samples)
        job.metrics.write({"kind": "train", "iteration": it, "lm_loss": out.loss, "grad_norm": out.grad_norm,
                           "learning_rate": out.lr, "loss_scale": out.loss_scale, "skipped": out.skipped,
                           "consumed_samples": progress.consumed_train_samples,
                           "elapsed_ms": elapsed * 1000.0,
                           "cpu_ms": cpu * 1000.0,  # this process's CPU time, all its threads (load moves it less)
                           "tokens_per_second": args.global_batch_size * args.seq_length / elapsed})
        if it % args.log_interval == 0:
            throughput = job.monitor.log_interval(it, stats)  # the timer block follows the line
            job.log(iteration_line(it, args.train_iters, progress.consumed_train_samples, stats, out.lr,
                                   args.global_batch_size, None if out.skipped else out.grad_norm, args.seq_length,
                                   out.loss_scale, throughput=throughput))
            job.monitor.flush_timers()
            stats = IntervalStats()
        if do_valid and args.eval_interval and it % args.eval_interval == 0:
            _evaluate_and_print(job, forward_step_func, f"iteration {it}", valid_iters, "valid")
        if args.save and args.save_interval and it % args.save_interval == 0:
            save()
        over_time = (args.exit_duration_in_mins is not None
                     and (time.time() - wall_start) / 60.0 > args.exit_duration_in_mins)
        if (args.exit_interval and it % args.exit_interval == 0) or over_time:
            if args.save:
                save()
            job.log(f"exiting program at iteration {it}")
            exited_early = True
            break

    job.log(f"[after training is done] datetime: {stamp()}")
    result.peak_rss_mb = _peak_rss_mb()
    job.log(f"[Rank {job.rank}] peak host memory (RSS): {result.peak_rss_mb:.1f} MB")
    result.peak_device_memory_mb = backend.device.peak_memory_mb()
    if result.peak_device_memory_mb is not None:
        job.log(f"[Rank {job.rank}] peak device memory: {result.peak_device_memory_mb:.1f} MB")
    if not exited_early:
        it = progress.iteration
        if args.save and it != 0:
            save()
        if do_valid:
            _evaluate_and_print(job, forward_step_func, f"iteration {it} on validation set", valid_iters, "valid")
        if test_loader is not None and args.eval_iters > 0:
            _evaluate_and_print(job, forward_step_func, f"iteration {it} on test set",
                                _iterators(test_loader, job.layout), "test")
    job.log(job.monitor.summary(progress.iteration, args.train_iters,
                                f"{args.save} (iteration {last_saved})" if args.save and last_saved else None))
    job.metrics.write({"kind": "summary", "framework": job.framework, "iteration": progress.iteration,
                       "peak_rss_mb": result.peak_rss_mb, "peak_device_memory_mb": result.peak_device_memory_mb,
                       "device": job.engine.device(), "world_size": args.world_size,
                       "engine": job.engine.name, "parallel": job.layout.to_json()})
