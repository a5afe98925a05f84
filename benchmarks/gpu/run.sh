#!/usr/bin/env bash
# On a GPU machine: the CUDA test suite and the GPU benchmarks, from a checkout (no install needed beyond torch,
# transformers >= 5.20, typer, rich, matplotlib). Usage: benchmarks/gpu/run.sh STEP [OUT]
#   tests   pytest -m cuda (every kernel on CUDA in fp32/bf16/fp16, against the dense references)
#   quick   a short bf16 sweep (4K, 16K) to check the bench end to end
#   base    bf16 sweep, base size, batch 1 and the largest batch that fits, 1K-32K, forward and forward+backward
#   large   the same at large size (24 layers, 1024 hidden)
#   memory  base littlebird training step with gradient checkpointing, 4K-32K (memory growth)
set -uo pipefail
step=$1
out=${2:-benchmarks/results}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$out"
longbird() { python3 -m longbird.cli "$@"; }
all_models=(--model littlebird --model kobigbird --model hf-bigbird --model hf-longformer --model sdpa-roberta)
lengths=(--length 1024 --length 2048 --length 4096 --length 8192 --length 16384 --length 32768)
case $step in
  tests) python3 -m pytest -q -m cuda -p no:cacheprovider --durations=15 tests/test_devices.py ;;
  quick) longbird bench --device cuda --dtype bf16 --length 4096 --length 16384 --repeats 5 --out "$out" \
           --model littlebird --model kobigbird --model hf-bigbird --model sdpa-roberta --name bench_gpu_quick ;;
  base) longbird bench --device cuda --dtype bf16 "${lengths[@]}" "${all_models[@]}" --batch 1 --batch max \
          --max-batch 64 --repeats 5 --max-memory-gib 70 --out "$out" --name bench_gpu_base ;;
  large) longbird bench --device cuda --dtype bf16 --size large "${lengths[@]}" "${all_models[@]}" --batch 1 \
           --batch max --max-batch 32 --repeats 3 --max-memory-gib 70 --out "$out" --name bench_gpu_large ;;
  memory) longbird bench --device cuda --dtype bf16 --model littlebird --mode forward+backward --gradient-checkpointing \
            --length 4096 --length 8192 --length 16384 --length 32768 --repeats 3 --out "$out" --name bench_gpu_memory ;;
  *) echo "unknown step $step (tests, quick, base, large, memory)"; exit 2 ;;
esac
