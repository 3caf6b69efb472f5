#!/usr/bin/env bash
# One call on the H200: what a session has to check there, each part under its own time limit, logs in one folder.
#
#   bash benchmarks/gpu_session.sh OUT [tests] [example] [suite] [wide] [tiling] [counters] [e2e]   (default: tests example suite e2e)
#
# Run from the repository root after installing the carried jax-triton wheel on PYTHONPATH. Parts:
#   tests    the whole test suite with LIGER_JAX_IMPLEMENTATION=triton (4 groups at once, ~4 min), then the convergence
#            test at the mini config (CONVERGENCE=0 skips it)
#   example  the main job with and without liger, interleaved (benchmarks/main_job.py; MAIN_JOB_FLAGS, default tiny,
#            mini and small, 3 runs each): median tokens/s in OUT/main_job/main_job.md
#   suite    python -m benchmarks.suite (per-op tables, plots, RESULTS.md) within SUITE_BUDGET_S (default 575)
#   wide     the norms' kernels on rows past one tile against XLA (benchmarks.wide_rows_check), then their tiling
#            candidates at 32768 and 65536 columns (benchmarks.norm_tiling --grid wide), tables in OUT/wide
#   tiling   the row kernels' tiling candidates (benchmarks.row_tiling) of the ops in TILING_OPS (default
#            group_norm, modulated_rms_norm and sparsemax: GroupNorm's token splits, modulated RMSNorm's backward
#            prefetch and sparsemax's walking forward are yet to be measured), tables in OUT/tiling
#   counters hardware counters (ncu) of the kernels of COUNTER_CASES (default: RMSNorm, LayerNorm and fused
#            add+RMSNorm at 4096 × 32768, the widths issue 19 still wants faster), via benchmarks.kernel_counters
#   e2e      the end-to-end 1b step alone (tokens/s and memory, with and without liger, at the same batch and at
#            each one's largest): the providers in E2E_PROVIDERS (default "xla liger_jax") within E2E_BUDGET_S
#            (default 540) (E2E_FLAGS=--remat for the rematerialised comparison)
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_session.sh OUT [tests] [example] [suite] [wide] [tiling] [counters] [e2e]}
shift
parts=("$@")
[[ ${#parts[@]} -eq 0 ]] && parts=(tests example suite e2e)
mkdir -p "$out"

for part in "${parts[@]}"; do
  echo "== $part ($(date -u +%H:%M:%S))"
  case $part in
    tests)
      # Four pytest processes share the GPU (no preallocation): Triton compiles are CPU-bound, 16 cores wait.
      groups=(
        "tests/test_rms_norm.py tests/test_flax_rms_norm.py tests/test_runtime.py tests/test_fused_add_rms_norm.py
         tests/test_layer_norm.py tests/test_flax_layer_norm.py tests/test_norms_math.py tests/test_dispatch.py
         tests/test_triton_ffi.py tests/test_group_norm.py"
        "tests/test_glu.py tests/test_rope.py tests/test_cross_entropy.py tests/test_flax_cross_entropy.py
         tests/test_glu_math.py tests/test_rope_math.py tests/test_cross_entropy_math.py tests/test_sparsemax.py
         tests/test_softmax.py tests/test_activations.py"
        "tests/test_fused_linear_cross_entropy.py tests/test_vocab_parallel.py tests/test_sharding.py
         tests/test_sharded_training.py"
        "tests/test_swap.py tests/test_llama.py tests/test_tunix_swap.py tests/test_tunix_loss.py
         tests/test_train_example.py tests/test_tunix_sft_example.py"
      )
      for i in "${!groups[@]}"; do
        # shellcheck disable=SC2086  # each group is a list of paths
        XLA_PYTHON_CLIENT_PREALLOCATE=false LIGER_JAX_IMPLEMENTATION=triton timeout "${TESTS_TIMEOUT_S:-300}" \
          python3 -m pytest ${groups[$i]} -p no:cacheprovider -rfs >"$out/tests_$i.log" 2>&1 &
      done
      wait
      for i in "${!groups[@]}"; do tail -n 1 "$out/tests_$i.log"; grep -E "^FAILED" "$out/tests_$i.log"; done
      if [[ ${CONVERGENCE:-1} == 1 ]]; then
        LIGER_JAX_CONVERGENCE=mini LIGER_JAX_IMPLEMENTATION=triton timeout 150 python3 -m pytest \
          tests/test_convergence.py -q -p no:cacheprovider -rf >"$out/convergence.log" 2>&1
        tail -3 "$out/convergence.log"
      fi
      ;;
    example)
      # shellcheck disable=SC2086  # MAIN_JOB_FLAGS is a list
      PYTHONUNBUFFERED=1 python3 -m benchmarks.main_job --out "$out/main_job" ${MAIN_JOB_FLAGS:-} >"$out/main_job.log" 2>&1
      tail -6 "$out/main_job.log"
      ;;
    suite)
      PYTHONUNBUFFERED=1 python3 -m benchmarks.suite --out "$out/suite" --budget-s "${SUITE_BUDGET_S:-575}" \
        >"$out/suite.log" 2>&1
      sed -n '/## Targets/,/^Times are/p' "$out/suite/RESULTS.md"
      ;;
    wide)
      timeout 150 python3 -m benchmarks.wide_rows_check >"$out/wide_check.log" 2>&1
      tail -n 16 "$out/wide_check.log"
      PYTHONUNBUFFERED=1 timeout "${WIDE_TIMEOUT_S:-250}" python3 -m benchmarks.norm_tiling --grid wide \
        --out "$out/wide" >"$out/wide.log" 2>&1
      tail -n 40 "$out/wide.log"
      ;;
    tiling)
      # shellcheck disable=SC2086  # TILING_OPS is a list
      PYTHONUNBUFFERED=1 timeout "${TILING_TIMEOUT_S:-300}" python3 -m benchmarks.row_tiling \
        --op ${TILING_OPS:-group_norm modulated_rms_norm sparsemax} --out "$out/tiling" >"$out/tiling.log" 2>&1
      tail -n 30 "$out/tiling.log"
      ;;
    counters)
      # shellcheck disable=SC2086  # COUNTER_CASES is a list
      timeout "${COUNTERS_TIMEOUT_S:-300}" python3 -m benchmarks.kernel_counters ${COUNTER_CASES:-rms_norm:tokens=4096,hidden=32768 \
        layer_norm:tokens=4096,hidden=32768 fused_add_rms_norm:tokens=4096,hidden=32768} --out "$out/counters" \
        >"$out/counters.log" 2>&1
      tail -n 20 "$out/counters.log"
      ;;
    e2e)
      # shellcheck disable=SC2086  # E2E_PROVIDERS and E2E_FLAGS are lists
      PYTHONUNBUFFERED=1 python3 -m benchmarks.e2e --provider ${E2E_PROVIDERS:-xla liger_jax} --out "$out/e2e" \
        --budget-s "${E2E_BUDGET_S:-540}" ${E2E_FLAGS:-} >"$out/e2e.log" 2>&1
      tail -8 "$out/e2e.log"
      ;;
    *)
      echo "unknown part: $part (tests, example, suite, wide, tiling, counters, e2e)" >&2
      exit 2
      ;;
  esac
done
