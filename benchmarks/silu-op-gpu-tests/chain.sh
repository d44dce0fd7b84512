#!/usr/bin/env bash
# Detached device chain, written 2026-12-05 and not yet run (the device time of that session was spent; issue 16): the GPU tests of the op library
# with the SiLU product added (tests/test_silu_products.py: the op against its spelling on the CUDA EP) and of the
# Gated DeltaNet op whose kernel loading and launching it now shares (tests/test_gdn_library.py). Run with
# scripts/device.sh: start CHAIN (carry .device/p1), stage 2..5, stage 6 with .device/ort-include copied to
# /tmp/ort-include, poll "chain done".
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
env GPU_TESTS="tests/test_silu_products.py tests/test_gdn_library.py" bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1
log "rc-g $?"; pack g
log "chain done"
