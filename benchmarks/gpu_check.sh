#!/usr/bin/env bash
# One call on a GPU machine checks what a CPU machine cannot: placement on CUDA, CPU-vs-GPU losses,
# resuming across devices, one sync per step, the Triton hash dropout, and the speed benchmark.
#
#   bash benchmarks/gpu_check.sh                 # from a checkout; results under $OUT (default ./gpu_check_out)
#   OUT=/somewhere bash benchmarks/gpu_check.sh
#
# The GPU machine has python3 with torch (CUDA), numpy, safetensors, tokenizers, pyyaml, pytest, hypothesis;
# mmrun is installed from this checkout into /tmp/mm without its other dependencies (libcst, tree-sitter and
# MindSpore are not needed here). megatron-core rows appear when it is importable (e.g. wheels unpacked into a
# folder named by MCORE_SITE). MM_TARGET (default /tmp/mm) is where mmrun is installed; BENCH_ARGS are passed
# to the benchmark (e.g. "--precisions bf16"). Exit status: 0 when every step passed, else the number of
# failed steps.
set -uo pipefail

CHECKOUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$PWD/gpu_check_out}"
PY="${PYTHON:-python3}"
MM_TARGET="${MM_TARGET:-/tmp/mm}"
read -r -a BENCH <<< "${BENCH_ARGS:-}"
mkdir -p "$OUT"
failed=0

step() {  # step NAME COMMAND...: run, tee the log under $OUT, count failures
    local name="$1"; shift
    echo "== $name" | tee -a "$OUT/summary.txt"
    if "$@" > "$OUT/$name.log" 2>&1; then
        echo "   ok" | tee -a "$OUT/summary.txt"
    else
        echo "   FAILED (exit $?), see $name.log" | tee -a "$OUT/summary.txt"
        failed=$((failed + 1))
    fi
    tail -n 25 "$OUT/$name.log"
}

: > "$OUT/summary.txt"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not found" > "$OUT/nvidia-smi.txt"
step install "$PY" -m pip install --no-index --no-deps --no-build-isolation --upgrade --target "$MM_TARGET" "$CHECKOUT"
export PYTHONPATH="$MM_TARGET${MCORE_SITE:+:$MCORE_SITE}${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$MM_TARGET/bin:$PATH"
step environment "$PY" -c "import torch, mmrun.backend as b; print(torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'); print(b.current());
import importlib.util as u; print('triton', u.find_spec('triton') is not None, 'megatron-core', u.find_spec('megatron') is not None)"

cd "$CHECKOUT" || exit 1
# pytest runs the checkout's tests against the installed copy (conftest paths point at the checkout's entry).
PYTEST=("$PY" -m pytest -q -rs -s)  # pyproject.toml adds --import-mode=importlib -p no:cacheprovider
step placement_test "${PYTEST[@]}" tests/training/test_placement.py
step cuda_devices_test "${PYTEST[@]}" tests/training/test_cuda_devices.py --junitxml="$OUT/cuda_devices.xml"
step torch_kernels_test "${PYTEST[@]}" tests/backend_api/test_dropout_impl.py \
    tests/backend_api/test_attention.py::test_torch_fused_attention_equals_the_explicit_path \
    tests/backend_api/test_attention.py::test_native_attention_dropout_is_torchs_own -k "not mindspore"
step benchmark env OUT="$OUT" "$PY" benchmarks/gpt_accelerator.py "${BENCH[@]}"
# The lead's reference scripts, when this checkout sits beside shared/ (same run, same GPU).
if [ -d "$CHECKOUT/../shared/tools/gpu" ]; then
    step reference_plain_torch "$PY" "$CHECKOUT/../shared/tools/gpu/plain_gpt.py" --precision bf16
fi
echo "failed steps: $failed" | tee -a "$OUT/summary.txt"
exit "$failed"
