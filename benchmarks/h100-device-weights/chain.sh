#!/usr/bin/env bash
# Device chain (issue 17), run on 2026-12-07 on an NVIDIA H100 80GB HBM3 (chain.txt; t in gpu-tests/, w in
# 0.8B-memory/; plot.py draws memory.png from its memory.json): one copy of the weights for every session of a
# process (runtime/runners/device_weights.py), after h100-capture-policy's 4B over HTTP ran the 80 GB H100 out of
# memory at 8 clients (2 instances x 3 sessions, each with its own copy of the 8.4 GB of weights).
#  t  tests/test_device_weights.py on the GPU: a CUDA bf16 engine with CUDA graphs answers the same with the shared
#     copy as with its own, and zeroing the shared copy changes its answers (the sessions read it in place)
#  w  the 0.8B (bf16/graphs/gdn16/mixers, the GatedDeltaNet kernel: nothing to compile) loaded 1 and 2 times with and
#     without sharing: device memory in use (memory.py)
# Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..7, poll "chain done".
set -u
source scripts/device-chain.sh
mkdir -p $R/t $R/w
bash scripts/h200.sh 0.8B $R/w synth > $R/w/chain-synth.log 2>&1; log "rc-w-synth $?"
wait_for_wheels
GPU_TESTS=tests/test_device_weights.py bash scripts/h200.sh 0.8B $R/t gpu-tests > $R/t/chain-gpu-tests.log 2>&1 &
tests=$!
env PRECISIONS=bf16/graphs/gdn16/mixers bash scripts/h200.sh 0.8B $R/w export,build > $R/w/chain-build.log 2>&1
log "rc-w-build $?"
wait $tests; log "rc-t-gpu-tests $?"; pack t
python3 benchmarks/h100-device-weights/memory.py /dev/shm/w/engine-0.8B-GatedDeltaNet-bf16-graphs-gdn16-mixers > $R/w/memory.json 2> $R/w/memory.log
log "rc-w-memory $?"; pack w
log "chain done"
