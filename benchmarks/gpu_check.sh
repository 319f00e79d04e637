#!/usr/bin/env bash
# The one command a GPU owner runs: what a CPU machine cannot check, in under 10 minutes on one H100, one table
# at the end (also $OUT/gpu_check.md).
#
#   bash benchmarks/gpu_check.sh                 # from a checkout on the GPU machine; results under $OUT
#   OUT=/somewhere bash benchmarks/gpu_check.sh  # (default ./gpu_check_out)
#   bash benchmarks/gpu_check.sh --cpu-smoke     # the same steps, tiny, on the CPU of a dev machine (its venv):
#                                                # checks this script, measures nothing of note
#
# Steps (each with a time limit; their sum is 600 s on the GPU, 1090 s for the smoke on a busy 2-core CPU):
#   install       mmrun from this checkout into $MM_TARGET (default /tmp/mm) without its dependencies (GPU only)
#   environment   torch, the device, Triton, megatron-core
#   engines       benchmarks/engine_matrix.py: portable, megatron-core with and without --use-distributed-optimizer,
#                 FSDP2 x fp32/bf16 x GPT/VLM: train 4 iterations + save, resume 2 more
#   cuda_tests    tests/training/test_cuda_devices.py (CPU vs GPU losses, resume across devices, one sync per
#                 step, the Triton hash dropout bit-exact), test_placement.py, the torch kernel tests
#   gpt_speed     benchmarks/gpt_accelerator.py: mmrun's GPT vs plain torch (and torch.compile) vs megatron-core
#   dropout_speed benchmarks/hash_dropout.py: the hash dropout vs F.dropout
#   vlm_speed     benchmarks/vlm_engines.py: megatron-core's VLM engine vs the portable engine, same precision
# A missing piece (no megatron-core, no Triton, no CUDA) is a row that says so. Exit status: the number of
# failed steps. The GPU machine's python3 has torch, numpy, safetensors, tokenizers, pyyaml, pytest; megatron-core
# and transformers come from wheels unpacked into a folder named by MCORE_SITE (see docs/gpu.md).
# BENCH_ARGS are added to gpt_accelerator.py's arguments.
set -uo pipefail

SMOKE=0
case "${1:-}" in
    --cpu-smoke|--cpu_smoke) SMOKE=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    "") ;;
    *) echo "gpu_check.sh: unknown argument $1; pass --cpu-smoke or nothing (--help)" >&2; exit 2 ;;
esac

CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$(mkdir -p "${OUT:-$PWD/gpu_check_out}" && cd "${OUT:-$PWD/gpu_check_out}" && pwd)"
export OUT
PY="${PYTHON:-python3}"
MM_TARGET="${MM_TARGET:-/tmp/mm}"
read -r -a BENCH <<< "${BENCH_ARGS:-}"
STEPS="$OUT/steps.tsv"
: > "$STEPS"
failed=0

step() {  # step NAME LIMIT_S COMMAND...: run under a time limit, log under $OUT, one line in steps.tsv
    local name="$1" limit="$2" code detail
    shift 2
    echo "== $name (limit ${limit} s)"
    timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
    code=$?
    detail="$(grep -v '^[[:space:]]*$' "$OUT/$name.log" | tail -n 1 | tr '\t' ' ' | cut -c1-200)"
    if [ "$code" -eq 0 ]; then
        printf '%s\tok\t%s\n' "$name" "$detail" >> "$STEPS"
    else
        [ "$code" -eq 124 ] && detail="timed out after ${limit} s; $detail"
        printf '%s\tFAILED (exit %s)\t%s\n' "$name" "$code" "$detail" >> "$STEPS"
        failed=$((failed + 1))
    fi
    tail -n 15 "$OUT/$name.log"
}

skip() {  # skip NAME REASON
    printf '%s\tskipped\t%s\n' "$1" "$2" >> "$STEPS"
}

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not found" > "$OUT/nvidia-smi.txt"
if [ "$SMOKE" -eq 1 ]; then
    export CUDA_VISIBLE_DEVICES=""  # the CPU, whatever this machine has
    skip install "--cpu-smoke: the checkout's own environment"
else
    step install 40 "$PY" -m pip install --no-index --no-deps --no-build-isolation --upgrade --target "$MM_TARGET" \
        "$CHECKOUT"
    export PYTHONPATH="$MM_TARGET${MCORE_SITE:+:$MCORE_SITE}${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$MM_TARGET/bin:$PATH"
fi
step environment 20 "$PY" -c "import importlib.util as u, torch, mmrun.backend as b
print('torch', torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')
print(b.current())
print('triton', u.find_spec('triton') is not None, 'megatron-core', u.find_spec('megatron') is not None)"

cd "$CHECKOUT" || exit 1
# pytest runs the checkout's tests against the installed copy (pyproject.toml adds --import-mode=importlib).
PYTEST=("$PY" -m pytest -q -rs -p no:randomly)
if [ "$SMOKE" -eq 1 ]; then
    step engines 500 "$PY" benchmarks/engine_matrix.py --cpu-smoke
    step cuda_tests 110 "${PYTEST[@]}" tests/training/test_cuda_devices.py
    step gpt_speed 200 "$PY" benchmarks/gpt_accelerator.py --precisions fp32 --impls mmrun plain-torch --iters 2 \
        --warmup 1 --repeat 1
    step dropout_speed 60 "$PY" benchmarks/hash_dropout.py --cpu-smoke
    step vlm_speed 200 "$PY" benchmarks/vlm_engines.py --cpu-smoke
else
    step engines 170 "$PY" benchmarks/engine_matrix.py --jobs 6 --timeout 120
    step cuda_tests 80 "${PYTEST[@]}" tests/training/test_cuda_devices.py tests/training/test_placement.py \
        tests/backend_api/test_dropout_impl.py \
        tests/backend_api/test_attention.py::test_torch_fused_attention_equals_the_explicit_path \
        tests/backend_api/test_attention.py::test_native_attention_dropout_is_torchs_own -k "not mindspore"
    step gpt_speed 140 "$PY" benchmarks/gpt_accelerator.py --precisions bf16 --iters 10 --warmup 5 "${BENCH[@]}"
    step dropout_speed 30 "$PY" benchmarks/hash_dropout.py --rounds 3
    # 93 s on an H200 (2026-11-27): four one-process jobs, each starting torch (and megatron-core)
    step vlm_speed 120 "$PY" benchmarks/vlm_engines.py --warmup 3 --iters 10 --repeat 1
fi
"$PY" benchmarks/gpu_check_table.py "$OUT" | tee "$OUT/gpu_check.md"
echo "failed steps: $failed"
exit "$failed"
