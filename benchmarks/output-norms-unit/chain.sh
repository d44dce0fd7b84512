#!/usr/bin/env bash
# Device chain for the next run (issue 16), written 2026-12-06 and not yet run (no machine could be started after):
# tests/test_output_norms.py on the GPU once more, after benchmarks/h100-call-groups/chain-4B.sh's g2 found its unit model
# reshaping the norm's [N, D] rows by a constant [0, 0, H * D] (the export computes [B, T, -1]). Run as
# benchmarks/h100-call-groups/chain.sh is (start, stage 2..6 with .device/ort-include, poll "chain done"); name the
# record after the card that ran it.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g3
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
env GPU_TESTS="tests/test_output_norms.py" PYTEST_ADDOPTS="-s" bash scripts/h200.sh 0.8B $R/g3 gpu-tests > $R/g3/chain.log 2>&1
log "rc-g3 $?"; pack g3
log "chain done"
