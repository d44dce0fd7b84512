#!/usr/bin/env bash
# Detached device chain (issue 16), written 2026-12-06 and not yet run (no device time was left that session): the
# runner's blocks grouped for fewer continue calls on the CUDA EP (s1omni.runtime.runners.onnxruntime_runner:
# length_groups, DEFAULT_CALL_COST_TOKENS; set the CUDA runners' default to the cost to serve before running, so that
# validate holds that grouping to the gate). Run with scripts/device.sh:
# start CHAIN (carry .device/p1), stage 2..5, the last with .device/ort-include copied to /tmp/ort-include, then poll
# "chain done" in as few calls as the time allows. Name the record after the card that ran it.
#  e  the 0.8B, the best validated build (ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/norms/attn16):
#     validated with the tree's grouping, then ab.py (call costs 0, 512, 1,024 in turn, one process), then bench
#     (router, backbone; both references in the same run; the router profiled)
#  f  the 4B, its best (bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16): the same
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/e $R/f
K=ChunkedGatedDeltaRule
BEST08=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/norms/attn16
BEST4=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16
engine() { echo "$S1OMNI_SCRATCH/engine-$1-$K-$(echo "$2" | tr / -)"; }
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-f-synth $?"
(env KERNELS=$K PRECISIONS=$BEST4 bash scripts/h200.sh 4B $R/f export,build > $R/f/chain-export.log 2>&1; log "rc-f-export-build $?") & build4=$!
env KERNELS=$K PRECISIONS=$BEST08 bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
wait $build4
if passed $R/e/validate-0.8B-$K-$(echo $BEST08 | tr / -).json; then
  S1OMNI_HOME=$S1OMNI_WORK/home python3 benchmarks/call-groups/ab.py --engine "$(engine 0.8B $BEST08)" --out $R/e/ab.json \
    > $R/e/ab.log 2>&1; log "rc-e-ab $?"; pack e
  env KERNELS=$K PRECISIONS=$BEST08 WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
    bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
fi
env KERNELS=$K PRECISIONS=$BEST4 bash scripts/h200.sh 4B $R/f validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
if passed $R/f/validate-4B-$K-$(echo $BEST4 | tr / -).json; then
  S1OMNI_HOME=$S1OMNI_WORK/home python3 benchmarks/call-groups/ab.py --engine "$(engine 4B $BEST4)" --out $R/f/ab.json \
    > $R/f/ab.log 2>&1; log "rc-f-ab $?"; pack f
  env KERNELS=$K PRECISIONS=$BEST4 WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
    bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
fi
log "chain done"
