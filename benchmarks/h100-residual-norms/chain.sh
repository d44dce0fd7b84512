#!/usr/bin/env bash
# Detached device chain, 2026-12-05 (issue 16): the 0.8B with the residual-norm op, beside the same build without it.
# (chain-gpu-tests.sh ran both ops' GPU tests first; its machine went back before its builds.) Run with
# scripts/device.sh: start CHAIN (carry .device/p1), stage 2..5, stage 6 with .device/ort-include copied to
# /tmp/ort-include, poll "chain done" (each pack reaches $OUT as it is made).
#  e  ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/silu/attn16 with --fused-residual-norms, then without;
#     the first validated (the second's options passed on the H200 in h200-silu-op; the session's device time left
#     no room for its gate run here, so the bench runs with ALLOW_UNVALIDATED), then both timed in one run (router,
#     backbone), the first profiled on the router request
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/e
K=ChunkedGatedDeltaRule
NORMS=bf16/graphs/gdn16/mixers/conv16/silu/norms/attn16
SILU=bf16/graphs/gdn16/mixers/conv16/silu/attn16
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
env KERNELS=$K PRECISIONS=$NORMS bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
env KERNELS=$K PRECISIONS=$SILU bash scripts/h200.sh 0.8B $R/e build > $R/e/chain-build.log 2>&1; log "rc-e-build $?"
env KERNELS=$K PRECISIONS=$NORMS,$SILU WORKLOADS=router,backbone REQUESTS=10 PROFILE=router ALLOW_UNVALIDATED=1 \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
log "chain done"
