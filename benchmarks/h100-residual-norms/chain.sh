#!/usr/bin/env bash
# Detached device chain, written and run 2026-12-05 on an H100 80GB (chain.txt; issue 16): the residual-norm op in engines, with a gate
# run before any timing. (chain-gpu-tests.sh ran both ops' GPU tests on an H100; its machine went back before its
# builds, and the session's device time went to two refused starts.) Run with scripts/device.sh: start CHAIN
# (carry .device/p1), stage 2..5, stage 6 with .device/ort-include copied to /tmp/ort-include, then poll "chain
# done" in as few calls as the time allows (each pack reaches $OUT as it is made; a gap between calls may lose the
# machine). Name the record after the card that ran it.
#  g  tests/test_residual_norms.py on the GPU: the ops, and the rewritten tiny graphs end to end on the CUDA EP
#     (padding masks in bfloat16 included) against their emulation, written after chain-gpu-tests.sh ran
#  e  the 0.8B: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/silu/attn16 with --fused-residual-norms and
#     without, each validated, then both timed in one run (router, backbone), the first profiled on the router request
#  f  the 4B: the same two builds, validated and timed (router, backbone), the first profiled
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/f
K=ChunkedGatedDeltaRule
BOTH=bf16/graphs/gdn16/mixers/conv16/silu/norms/attn16,bf16/graphs/gdn16/mixers/conv16/silu/attn16
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_residual_norms.py" bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-f-synth $?"
wait $tests
(bash scripts/h200.sh 4B $R/f export > $R/f/chain-export.log 2>&1; log "rc-f-export $?") & export4=$!
env KERNELS=$K PRECISIONS=$BOTH bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
wait $export4
env KERNELS=$K PRECISIONS=$BOTH WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
env KERNELS=$K PRECISIONS=$BOTH bash scripts/h200.sh 4B $R/f build,validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
env KERNELS=$K PRECISIONS=$BOTH WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
  bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
log "chain done"
