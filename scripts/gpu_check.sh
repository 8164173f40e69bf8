#!/usr/bin/env bash
# The checks that need a GPU, as one command for a session that has one (a few minutes on one H200):
#   1. the GPU-only tests: in every test file that skips without `torch.cuda.is_available()`, the
#      tests whose names hold `cuda` or `gpu` (the other tests of those files run in CI);
#   2. benchmarks/gpu.py (the chapter's MGPU-7 table on the GPUs present; --quick with QUICK=1);
#   3. benchmarks/gpu_gpt.py (nanoGPT's baby GPT: ShapeScript f32, mixed bf16 and compiled against
#      nanoGPT's own model.py eager and with nanoGPT's defaults, issue 41; --quick with QUICK=1).
# Output goes to the terminal and, when OUT is set (the device tool sets it), to $OUT/gpu_tests.txt,
# $OUT/gpu_bench.txt, $OUT/gpu_table.md and $OUT/gpu_gpt.txt. Exits non-zero if the tests or the benchmark failed; with
# no GPU it says so and exits 0.
#
#   scripts/gpu_check.sh                    # python: $PYTHON, else .venv/bin/python, else python3
#   QUICK=1 scripts/gpu_check.sh            # the benchmark's smoke run only
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-}
log() { if [ -n "$out" ]; then tee "$out/$1"; else cat; fi; }

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "no CUDA device: nothing to check"
    exit 0
fi
"$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "|",
    ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))'

mapfile -t files < <(grep -rl --include='test_*.py' 'cuda.is_available()' tests | sort)
echo "GPU tests in: ${files[*]}"
timeout 210 "$PY" -m pytest -q -p no:cacheprovider -rs -k "cuda or gpu" "${files[@]}" 2>&1 | log gpu_tests.txt
tests=${PIPESTATUS[0]}

bench_args=(--out "${out:-${TMPDIR:-/tmp}}/gpu_table.md")
[ "${QUICK:-0}" = 1 ] && bench_args+=(--quick)
timeout 240 "$PY" benchmarks/gpu.py "${bench_args[@]}" 2>&1 | log gpu_bench.txt
bench=${PIPESTATUS[0]}

gpt_args=()
[ "${QUICK:-0}" = 1 ] && gpt_args+=(--quick)
timeout 300 "$PY" benchmarks/gpu_gpt.py "${gpt_args[@]}" 2>&1 | log gpu_gpt.txt
gpt=${PIPESTATUS[0]}

echo "gpu_check: tests exit $tests, benchmark exit $bench, GPT step exit $gpt"
[ "$tests" = 0 ] && [ "$bench" = 0 ] && [ "$gpt" = 0 ]
