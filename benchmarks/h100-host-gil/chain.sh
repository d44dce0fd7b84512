#!/usr/bin/env bash
# Device chain (issue 17), run on 2026-12-07 on an NVIDIA H100 80GB HBM3: `ARMS=rhs` (chain.txt), then on the same
# warm machine `ARMS=x` (chain-x.txt, reusing the build). Results: h in 0.8B-http-batching/, s in
# 0.8B-http-switch-interval/, r in 0.8B-http-ray-replicas2/, x in 0.8B-http-exact/; k (the 4B) was not run. After it,
# on the same machine, the in-process merged forwards of 0.8B-merged/ (its chain-bench.log names the command).
# h100-server-cpu's 0.8B over HTTP answered 37.6 req/s at 16 clients with the server's CPU a request flat across
# the load (70 -> 93 -> 82 ms) while its heads stage went 1.5 -> 63 -> 213 ms: waiting, not work, and the cores
# mostly idle (3 of 16). The host path holds the GIL about 16.5 ms a router request (cpu-host-path/gil, 2 cores),
# near the 37.6 req/s it reached; this tree holds it about 13.7 ms (the head pools' threads pinned to one torch
# thread once, tokenization through encode_batch, the sparse gate's probe decode stopping at K + 1 spans). This
# chain measures that change over HTTP, the same with a 0.5 ms GIL switch interval and through two Ray Serve
# processes, then the runs h100-server-cpu did not bring back: the 4B served, and the 0.8B with exact and one
# instance. Run with scripts/device.sh: start CHAIN (carry DIR/p1), stage 2..N, the last with .device/ort-include
# copied to /tmp/ort-include, then poll "chain done"; DIR is .device/ray (RAY=1 scripts/device-pack.sh, 10 parts)
# for the Ray arm, .device (6 parts) without it. Rename the folder after the card.
#  r  h's 0.8B build served as h serves it, but through Ray Serve: two replicas of one instance sharing the GPU (two
#     processes, two GILs), where ray is staged
#  h  the 0.8B (ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16)
#     built, validated, served with `batching` and two instances at 1, 8 and 16 clients (reference server beside it)
#  s  the 0.8B served as h with switch-interval/ first on PYTHONPATH (a 0.5 ms GIL switch interval in every process)
#  k  the 4B (.../heads/gates/onorms/silu/rotary/attn16) built, validated, served as h
#  x  the 0.8B served with `exact` and one instance at 1, 8 and 16 clients, if the device time lasts
# The 4B is synthesized, exported and built while the 0.8B builds and validates, before anything is timed. Only h
# and k serve the reference (about 3 minutes at 3 req/s); s, r and x serve the engine alone (NO_HTTP_REFERENCE)
# and compare with h, on the same machine in the same chain.
# ARMS (default rhskx) on the start call's command line runs a subset, e.g. `ARMS=rh scripts/device.sh start ...`.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
ARMS=${ARMS:-rhskx}  # the arms to run, in this order's subset (e.g. ARMS=rh when the device time is short)
arm() { [[ $ARMS == *$1* ]]; }
mkdir -p $R/h $R/x $R/k $R/s $R/r
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
http() {  # http SIZE PRECISION OUT PROFILE SERVE_ARGS [NO_HTTP_REFERENCE]: the router request over HTTP at 1, 8, 16 clients
  env NO_HTTP_REFERENCE=${6:-} KERNELS=$K PRECISIONS=$2 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=$4 SERVE_ARGS="$5" REQUESTS=20 \
    bash scripts/h200.sh $1 $R/$3 bench > $R/$3/chain-bench.log 2>&1; log "rc-$3-bench $?"; pack $3
}
log "arms $ARMS"
arm k && { bash scripts/h200.sh 4B $R/k synth > $R/k/chain-synth.log 2>&1 & synth4=$!; }
bash scripts/h200.sh 0.8B $R/h synth > $R/h/chain-synth.log 2>&1; log "rc-h-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
bash scripts/h200.sh 0.8B $R/h export > $R/h/chain-export.log 2>&1; log "rc-h-export $?"
if arm k; then
  wait $synth4; log "rc-k-synth $?"
  (env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/k export,build > $R/k/chain-export.log 2>&1
   log "rc-k-export-build $?") & build4=$!
fi
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/h build,validate > $R/h/chain-validate.log 2>&1
log "rc-h-validate $?"; pack h
if passed $R/h/validate-0.8B-$(name $NEW08).json; then
  if arm r; then
    if python3 -c "import ray.serve" 2> /dev/null; then
      http 0.8B $NEW08 r batching "--ray --replicas=2 --gpus-per-replica=0.5" 1
    else
      log "r skipped: ray is not staged"
    fi
  fi
  arm h && http 0.8B $NEW08 h batching --instances=2
  arm s && PYTHONPATH=$PWD/benchmarks/h100-host-gil/switch-interval${PYTHONPATH:+:$PYTHONPATH} http 0.8B $NEW08 s batching --instances=2 1
fi
if arm k; then
  wait $build4
  env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/k validate > $R/k/chain-validate.log 2>&1
  log "rc-k-validate $?"; pack k
  passed $R/k/validate-4B-$(name $NEW4).json && http 4B $NEW4 k batching --instances=2
fi
arm x && passed $R/h/validate-0.8B-$(name $NEW08).json && http 0.8B $NEW08 x exact --instances=1 1
log "chain done"
