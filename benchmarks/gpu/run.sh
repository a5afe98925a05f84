#!/usr/bin/env bash
# On a GPU machine: the CUDA test suite and the GPU benchmarks, from a checkout (no install needed beyond torch,
# transformers >= 5.20, typer, rich, matplotlib). Usage: benchmarks/gpu/run.sh STEP [OUT] (tests: [PYTEST ARGS])
#   tests   pytest -m cuda (every kernel on CUDA in fp32/bf16/fp16, against the dense references)
#   base    bf16 sweep, base size, batch 1, 1K-32K, forward and forward+backward
#   batch   base size, the largest batch that fits, 4K and 16K, forward+backward
#   memory  base littlebird training step with gradient checkpointing, 4K-32K (memory growth)
#   large   bf16 sweep, large size (24 layers, 1024 hidden), batch 1, 1K-32K
#   compiled  bf16, base size, batch 1, 512-8K forward: eager against torch.compile(fullgraph) in default and
#             reduce-overhead (CUDA graphs) mode, per preset (littlebird, kobigbird, tape)
#   rowplan   bf16, base size, batch 1, kobigbird at 2K and 8K forward, eager against torch.compile in default and
#             reduce-overhead mode, with the per-row plan in the op (LONGBIRD_ROW_PLAN=op, a host read per layer) and
#             made on the device (=device; with torch 2.11 on an H200 its compile failed, 2026-11-28, docs/gpu.md)
#   session OUT  what a short GPU lease (15 minutes, start included) should run first, in this order, each step with a
#             time limit (550 s in all, so that one 600-s device call holds it) and its log in OUT: the device row
#             plan's and TAPE's CUDA cases, the row-plan comparison, then the whole CUDA suite
set -uo pipefail
step=$1
shift
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [ "$step" = session ]; then
  out=${1:?usage: benchmarks/gpu/run.sh session OUT}
  mkdir -p "$out"
  here=$(dirname "$0")
  timeout 130 "$here/run.sh" tests -k "row_plan or tape" -v -rf 2>&1 | tee "$out/cuda_tests_first.log" | tail -15
  timeout 270 "$here/run.sh" rowplan "$out" 2>&1 | tee "$out/rowplan.log" | tail -45
  timeout 150 "$here/run.sh" tests -k "not row_plan and not tape" -rf 2>&1 | tee "$out/cuda_tests.log" | tail -15
  exit 0
fi
if [ "$step" = tests ]; then
  exec python3 -m pytest -q -m cuda -p no:cacheprovider --durations=10 tests/test_devices.py "$@"
fi
out=${1:-benchmarks/results}
mkdir -p "$out"
longbird() { python3 -m longbird.cli "$@"; }
models=(--model littlebird --model kobigbird --model hf-bigbird --model hf-longformer --model sdpa-roberta)
lengths=(--length 1024 --length 2048 --length 4096 --length 8192 --length 16384 --length 32768)
common=(--device cuda --dtype bf16 --max-memory-gib 70 --out "$out")
case $step in
  base) longbird bench "${common[@]}" "${models[@]}" "${lengths[@]}" --repeats 5 --name bench_gpu_base ;;
  batch) longbird bench "${common[@]}" "${models[@]}" --length 4096 --length 16384 --mode forward+backward \
           --batch max --max-batch 64 --repeats 3 --name bench_gpu_batch ;;
  memory) longbird bench "${common[@]}" --model littlebird --model kobigbird --mode forward+backward \
            --gradient-checkpointing --length 4096 --length 8192 --length 16384 --length 32768 --repeats 3 \
            --name bench_gpu_checkpointing ;;
  compiled) longbird bench "${common[@]}" --model littlebird --model kobigbird --model tape --length 512 \
              --length 2048 --length 8192 --mode forward --compile default --compile reduce-overhead --repeats 10 \
              --name bench_gpu_compiled ;;
  rowplan) for plan in op device; do
             LONGBIRD_ROW_PLAN=$plan longbird bench "${common[@]}" --model kobigbird --length 2048 --length 8192 \
               --mode forward --compile default --compile reduce-overhead --repeats 10 --name "bench_gpu_rowplan_$plan"
           done ;;
  large) longbird bench "${common[@]}" --size large "${models[@]}" "${lengths[@]}" --repeats 3 --name bench_gpu_large ;;
  *) echo "unknown step $step (tests, base, batch, memory, large, compiled, rowplan)"; exit 2 ;;
esac
