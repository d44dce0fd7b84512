#!/usr/bin/env bash
# Detached device chain, run 2026-12-05 on an H100 80GB (chain.txt, gpu-tests/: 23 passed; issue 16): the short-convolution op's GPU tests, its first run on a GPU (the op
# against float64 truth and against ONNX Runtime's own channels-last kernel, with both timed per call; the tiny
# member's rewritten graphs end to end on the CUDA EP). Run with scripts/device.sh: start CHAIN (carry
# .device/p1), stage 2..5, stage 6 with .device/ort-include copied to /tmp/ort-include, poll "chain done".
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
env GPU_TESTS="tests/test_short_convolutions.py" PYTEST_ADDOPTS="-s" \
  bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1; log "rc-g $?"; pack g
log "chain done"
