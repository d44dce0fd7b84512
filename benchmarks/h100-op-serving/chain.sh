#!/usr/bin/env bash
# Detached device chain, 2026-12-05 (issue 17: the flash-linear-attention op engine merged and served; issue 16: the
# 9B with the op). Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..5, stage 6 with
# .device/ort-include copied to /tmp/ort-include, poll "chain done".
#  e  the 0.8B: ChunkedGatedDeltaRule at bf16/graphs/gdn16/merged/mixers/conv16/attn16 (the last record's fastest),
#     validated alone, merged 8 to a forward and packed; then in process the router request alone, as router@4 and
#     router@8 (one merged forward: what `batching` runs) and packed (`shared_context`), router@8 profiled
#  h  that engine over HTTP with `batching` and two instances (every server), 1, 8 and 16 clients
#  n  the 9B: the same build, validated, the router and backbone workloads timed, the router profiled
#  s  the 0.8B over HTTP with `shared_context` and two instances, if the device time lasts
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/e $R/h $R/n $R/s
K=ChunkedGatedDeltaRule
BOTH=bf16/graphs/gdn16/merged/mixers/conv16/attn16
NAME=validate-SIZE-$K-bf16-graphs-gdn16-merged-mixers-conv16-attn16.json
bash scripts/h200.sh 9B $R/n synth > $R/n/chain-synth.log 2>&1 & synth9=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth9; log "rc-n-synth $?"
(bash scripts/h200.sh 9B $R/n export > $R/n/chain-export.log 2>&1; log "rc-n-export $?"
 env KERNELS=$K PRECISIONS=$BOTH bash scripts/h200.sh 9B $R/n build > $R/n/chain-build.log 2>&1; log "rc-n-build $?") & build9=$!
env KERNELS=$K PRECISIONS=$BOTH MERGED=8 bash scripts/h200.sh 0.8B $R/e build,validate,merged,shared > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
if passed $R/e/${NAME/SIZE/0.8B}; then
  env KERNELS=$K PRECISIONS=$BOTH WORKLOADS=router,router@4,router@8,router:shared_context REQUESTS=10 PROFILE=router@8 \
    bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
  env KERNELS=$K PRECISIONS=$BOTH WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 REQUESTS=20 \
    bash scripts/h200.sh 0.8B $R/h bench > $R/h/chain-bench.log 2>&1; log "rc-h-bench $?"; pack h
fi
wait $build9
env KERNELS=$K PRECISIONS=$BOTH bash scripts/h200.sh 9B $R/n validate > $R/n/chain-validate.log 2>&1; log "rc-n-validate $?"; pack n
if passed $R/n/${NAME/SIZE/9B}; then
  env KERNELS=$K PRECISIONS=$BOTH WORKLOADS=router,backbone REQUESTS=8 PROFILE=router bash scripts/h200.sh 9B $R/n bench \
    > $R/n/chain-bench.log 2>&1; log "rc-n-bench $?"; pack n
fi
if passed $R/e/${NAME/SIZE/0.8B}; then
  env KERNELS=$K PRECISIONS=$BOTH WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=shared_context SERVE_ARGS=--instances=2 REQUESTS=20 \
    bash scripts/h200.sh 0.8B $R/s bench > $R/s/chain-bench.log 2>&1; log "rc-s-bench $?"; pack s
fi
log "chain done"
