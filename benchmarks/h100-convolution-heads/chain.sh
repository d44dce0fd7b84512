#!/usr/bin/env bash
# Detached device chain, run 2026-12-06 on an H100 80GB (chain.txt; gpu-tests/: 18 passed; issue 16): the short convolution as one op (--fused-short-convolutions) and as one op writing
# the gated delta rule's q, k and v (--fused-convolution-heads) in engines, each validated before any timing. Run with
# scripts/device.sh: start CHAIN (carry .device/p1), stage 2..5, stage 6 with .device/ort-include copied to
# /tmp/ort-include, then poll "chain done" in as few calls as the time allows. Name the record after the card that ran it.
#  g  tests/test_convolution_heads.py on the GPU: the op against the graph it replaced (0.8B, 4B and tiny heads, 1 to
#     2,048 tokens), timed beside it; the tiny member's rewritten graphs end to end on the CUDA EP
#  e  the 0.8B: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/silu/norms/attn16 (the best validated build) and
#     it with /convop/heads; each validated, then both timed in one run (router, backbone), the latter profiled
#     (a first machine went back mid-staging: the /convop-only build was dropped to fit the device time left)
#  f  the 4B: bf16/graphs/gdn16/mixers/conv16/silu/attn16 and it with /convop/heads, validated and timed, the latter profiled
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/f
K=ChunkedGatedDeltaRule
BASE=bf16/graphs/gdn16/mixers/conv16/silu/norms/attn16
PAIR=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/norms/attn16,$BASE
TWO=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16,bf16/graphs/gdn16/mixers/conv16/silu/attn16
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_convolution_heads.py" PYTEST_ADDOPTS="-s" bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1
 log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-f-synth $?"
(bash scripts/h200.sh 4B $R/f export > $R/f/chain-export.log 2>&1; log "rc-f-export $?") & export4=$!
env KERNELS=$K PRECISIONS=$PAIR bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
wait $tests $export4
env KERNELS=$K PRECISIONS=$PAIR WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
env KERNELS=$K PRECISIONS=$TWO bash scripts/h200.sh 4B $R/f build,validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
env KERNELS=$K PRECISIONS=$TWO WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
  bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
log "chain done"
