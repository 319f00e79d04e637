"""ForwardPlan (engines/forward_plan.py): forward_step recorded and replayed; MindSpore's jit needs the
loss as functools.partial, and a closure falls back to PyNative with one notice unless --ms-jit insists."""
from __future__ import annotations

import functools
import textwrap

import numpy as np
import pytest

from mmrun.engines.base import TrainingError
from mmrun.engines.forward_plan import ForwardPlan


def _loss_func(mask, output):
    return (output * mask).sum(), mask.sum(), {"lm loss": ((output * mask).sum(), mask.sum())}


def _partial_step(data_iterator, model):
    tokens, mask = next(data_iterator)
    return model(tokens), functools.partial(_loss_func, mask)


def _closure_step(data_iterator, model):
    tokens, mask = next(data_iterator)
    return model(tokens), lambda output: _loss_func(mask, output)


def _batches():
    return iter([(np.arange(4.0), np.ones(4)), (np.arange(4.0) + 1, np.ones(4))])


def test_partial_loss_keeps_jit_and_replays_the_call():
    notices = []
    plan = ForwardPlan(_partial_step, lambda t: t * 2.0, jit=True, notice=notices.append)
    flat = plan.capture(_batches())
    assert plan.jit and not notices
    assert plan.loss(lambda t: t * 2.0, *flat) == pytest.approx(2.0 * (0 + 1 + 2 + 3) / 4)


def test_closure_falls_back_to_pynative_with_one_notice():
    notices = []
    plan = ForwardPlan(_closure_step, lambda t: t, jit=True, notice=notices.append)
    data = _batches()
    flats = [plan.capture(data), plan.capture(data)]
    assert not plan.jit
    assert len(notices) == 1 and "PyNative" in notices[0] and "partial(loss_func" in notices[0]
    assert [plan.loss(lambda t: t, *f) for f in flats] == [pytest.approx(1.5), pytest.approx(2.5)]


def test_closure_with_ms_jit_given_is_a_clear_error():
    plan = ForwardPlan(_closure_step, lambda t: t, jit=True, jit_required=True, notice=print)
    with pytest.raises(TrainingError, match="with --ms-jit, forward_step must return functools.partial"):
        plan.capture(_batches())


@pytest.mark.slow
def test_mindspore_entry_with_a_closure_trains_in_pynative(tmp_path, tk):
    """A Megatron script whose forward_step returns a closure: the job says so once and trains on."""
    entry = tmp_path / "closure_entry.py"
    entry.write_text(textwrap.dedent("""\
        from mmrun.models import pretrain_gpt
        from mmrun.training import ModelType, pretrain

        def forward_step(data_iterator, model):
            tokens, labels, loss_mask, _, position_ids = pretrain_gpt.get_batch(data_iterator)
            output = model(tokens, position_ids, labels=labels)
            return output, lambda out: pretrain_gpt.loss_func(loss_mask, out)

        pretrain(pretrain_gpt.train_valid_test_datasets_provider, pretrain_gpt.model_provider,
                 ModelType.encoder_or_decoder, forward_step, args_defaults=pretrain_gpt.CPU_DEFAULTS)
        """))
    import subprocess
    import sys
    args = ["--mock-data", "--train-iters", "4", "--log-interval", "1", "--eval-iters", "0", "--ai-framework", "mindspore"]
    proc = subprocess.run([sys.executable, str(entry), *args], cwd=tmp_path, env=tk.clean_env(),
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    assert out.count("notice: forward_step returned") == 1
    assert "> MindSpore train step: PyNative" in out
    assert out.count("iteration        ") >= 4
