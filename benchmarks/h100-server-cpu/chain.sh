#!/usr/bin/env bash
# Device chain (issues 17 and 16), written and run on 2026-12-07 on an H100 (chain.txt: h and f came back, k ran out of
# device time before it was packed, x was not reached; results: h in 0.8B-http-batching/, x in
# 0.8B-http-exact/, f in 4B/, k in 4B-http-batching/). h100-rotary-selection's HTTP record left the 0.8B at 39 req/s
# at 16 clients with its heads stage 95 ms and post 23 ms (6 and 13 at 8 clients): this chain repeats it with the
# server's CPU per request by thread pool (`server_cpu`, from /metrics' s1omni_thread_cpu_seconds), to tell which
# pool's work grows with the load; then the 4B with the newest ops (not run since h100-row-graphs) in process and
# over HTTP. Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..6, the last with
# .device/ort-include copied to /tmp/ort-include, then poll "chain done"; rename the folder after the card.
#  h  the 0.8B (ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16)
#     built, validated, served with `batching` and two instances at 1, 8 and 16 clients (reference server beside it)
#  f  the 4B (.../heads/gates/onorms/silu/rotary/attn16) built, validated and benched (router, backbone; both references)
#  k  the 4B over HTTP as h
#  x  the 0.8B served with `exact` and one instance at 1, 8 and 16 clients, if the device time lasts
# The 4B is synthesized, exported and built while the 0.8B builds and validates, before anything is timed.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/h $R/x $R/f $R/k
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
http() {  # http SIZE PRECISION OUT PROFILE INSTANCES: the router request over HTTP at 1, 8 and 16 clients
  env KERNELS=$K PRECISIONS=$2 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=$4 SERVE_ARGS=--instances=$5 REQUESTS=20 \
    bash scripts/h200.sh $1 $R/$3 bench > $R/$3/chain-bench.log 2>&1; log "rc-$3-bench $?"; pack $3
}
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/h synth > $R/h/chain-synth.log 2>&1; log "rc-h-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
bash scripts/h200.sh 0.8B $R/h export > $R/h/chain-export.log 2>&1; log "rc-h-export $?"
wait $synth4; log "rc-f-synth $?"
(env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/f export,build > $R/f/chain-export.log 2>&1
 log "rc-f-export-build $?") & build4=$!
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/h build,validate > $R/h/chain-validate.log 2>&1
log "rc-h-validate $?"; pack h
wait $build4
passed $R/h/validate-0.8B-$(name $NEW08).json && http 0.8B $NEW08 h batching 2
env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/f validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
if passed $R/f/validate-4B-$(name $NEW4).json; then
  env KERNELS=$K PRECISIONS=$NEW4 WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
    bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
  http 4B $NEW4 k batching 2
fi
passed $R/h/validate-0.8B-$(name $NEW08).json && http 0.8B $NEW08 x exact 1
log "chain done"
