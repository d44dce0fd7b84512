#!/usr/bin/env bash
# Device chain (issue 17), written on 2026-12-07, not yet run. h100-forward-alone found the 0.8B, once its CUDA graphs
# were captured, at 37.6 req/s with 16 clients and its heads stage a median 262 ms: the readout pool's 4 threads were
# each held 13.8 ms a task (6 a request: at most 48 req/s) while the span head's chunks ran, and its tasks waited 172.5
# ms for a thread. The pool now takes a thread a core, 4 to 16 (runtime/cpu_heads.py, readout_threads), and
# `s1omni bench --http` settles each level (untimed rounds until one captures no CUDA graph, at most 10) so that the
# timed windows are the steady state. Same build as h100-forward-alone; `--instances 2`, `batching`, 20 timed a client.
#  h  the 0.8B with S1OMNI_READOUT_THREADS=4 (the old pool), engine alone (the baseline of d, same machine)
#  d  the 0.8B with the default pool (16 threads on a 16-core host), then the reference server
#  g  the server of h (4 threads) at 16 clients sampled by py-spy (benchmarks/server-profile/server_profile.py): the
#     GIL's holders and every thread on a CPU, ms a request by thread pool and function, and how much of the time the
#     GIL is held (near 1: the GIL, not the pool, bounds the server)
#  p  the same for the server of d (the default pool): issue 17's server-side profile at 16 clients
#  k  the 4B (h100-forward-alone's k) with the default pool, engine alone: bound by its GPU time there (10-11 req/s),
#     it shows whether the settling and the pool change anything for a GPU-bound member; not in the default ARMS
# About 17 minutes for hdgp (h100-forward-alone: the 0.8B exported, built and validated in 3 minutes, its bench with the
# reference server 7), 23 with k. ARMS picks a subset (e.g. ARMS=hd when the device time is short).
# Run with scripts/device.sh: start CHAIN (carry DIR/p1), stage 2..N (the last with .device/ort-include copied to
# /tmp/ort-include), poll "chain done". Rename the folder after the card.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
ARMS=${ARMS:-hdgp}
arm() { [[ $ARMS == *$1* ]]; }
mkdir -p $R/h $R/d $R/g $R/p $R/k
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
http() {  # http SIZE PRECISION OUT NO_HTTP_REFERENCE [READOUT_THREADS]: the router request over HTTP at 1, 8, 16 clients
  env ${5:+S1OMNI_READOUT_THREADS=$5} NO_HTTP_REFERENCE=$4 KERNELS=$K PRECISIONS=$2 WORKLOADS=router PROFILE= HTTP=1,8,16 \
    HTTP_PROFILE=batching SERVE_ARGS=--instances=2 REQUESTS=20 bash scripts/h200.sh $1 $R/$3 bench > $R/$3/chain-bench.log 2>&1
  log "rc-$3-bench $?"; pack $3
}
profiled() {  # profiled OUT [READOUT_THREADS]: the 0.8B's server at 16 clients sampled by py-spy
  env ${2:+S1OMNI_READOUT_THREADS=$2} PYSPY=/tmp/site/bin/py-spy python3 benchmarks/server-profile/server_profile.py \
    --engine $S1OMNI_SCRATCH/engine-0.8B-$(name $NEW08) --device cuda --serve-arg=--instances=2 --profile batching \
    --concurrency 16 --out $R/$1 > $R/$1/chain-profile.log 2>&1
  log "rc-$1-profile $?"; pack $1
}
log "arms $ARMS"
arm k && { bash scripts/h200.sh 4B $R/k synth > $R/k/chain-synth.log 2>&1 & synth4=$!; }
bash scripts/h200.sh 0.8B $R/h synth > $R/h/chain-synth.log 2>&1; log "rc-h-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
if arm k; then
  wait $synth4; log "rc-k-synth $?"
  (env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/k export,build > $R/k/chain-export.log 2>&1
   log "rc-k-export-build $?") & build4=$!
fi
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/h export,build,validate > $R/h/chain-validate.log 2>&1
log "rc-h-validate $?"; pack h
arm k && wait $build4  # nothing else on the device while the servers are timed
if passed $R/h/validate-0.8B-$(name $NEW08).json; then
  arm h && http 0.8B $NEW08 h 1 4
  arm g && profiled g 4
  arm p && profiled p
  arm d && http 0.8B $NEW08 d ""
fi
if arm k; then
  env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/k validate > $R/k/chain-validate.log 2>&1
  log "rc-k-validate $?"; pack k
  passed $R/k/validate-4B-$(name $NEW4).json && http 4B $NEW4 k 1
fi
log "chain done"
