#!/usr/bin/env bash
# Device chain (issue 17), written on 2026-12-07, not yet run (the session's device time was spent): the capture
# policy of e524f7b (a worker that met a graph it could not capture holds its next forward alone,
# CAPTURE_LOCK.forward()) and one copy of the weights a process (runtime/runners/device_weights.py) on the runs
# h100-capture-policy made: there the 0.8B with captures that never waited answered 7.81 / 13.28 req/s at 8 / 16
# clients (h100-host-gil, captures waiting per graph: 38.64 / 40.35), and the 4B ran the 80 GB card out of memory at
# 8 clients with six copies of its weights. About 20 minutes with the plain pack (h100-capture-policy took 16:26-16:46).
#  t  the GPU tests: two instances of a CUDA-graph engine answering merged batches at 16 clients, graphs captured
#     (tests/server/test_server_instances.py), and the shared copy read in place (tests/test_device_weights.py)
#  h  the 0.8B (h100-host-gil's build) built, validated, served with `batching` and two instances at 1, 8 and 16
#     clients, the reference server last; `server_cpu.cuda_graphs` gives each level's captures and deferred runs
#  k  the 4B (.../heads/gates/onorms/silu/rotary/attn16) synthesized, exported and built while the 0.8B validates,
#     validated, served as h without the reference server (about 1.5 of its router requests a second)
# Run with scripts/device.sh: start CHAIN (carry DIR/p1), stage 2..N (the last with .device/ort-include copied to
# /tmp/ort-include), poll "chain done"; DIR: parts small enough to travel beside the tree (64 MiB a call), e.g.
# PART_BYTES=28M scripts/device-pack.sh. Rename the folder after the card.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/t $R/h $R/k
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
bash scripts/h200.sh 4B $R/k synth > $R/k/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/h synth > $R/h/chain-synth.log 2>&1; log "rc-h-synth $?"
wait_for_wheels
wait $synth4; log "rc-k-synth $?"
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
(env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/k export,build > $R/k/chain-export.log 2>&1
 log "rc-k-export-build $?") & build4=$!
GPU_TESTS="tests/server/test_server_instances.py tests/test_device_weights.py" \
  bash scripts/h200.sh 0.8B $R/t gpu-tests > $R/t/chain-gpu-tests.log 2>&1
log "rc-t-gpu-tests $?"; pack t
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/h export,build,validate > $R/h/chain-validate.log 2>&1
log "rc-h-validate $?"; pack h
wait $build4  # nothing else on the device while the servers are timed
if passed $R/h/validate-0.8B-$(name $NEW08).json; then
  env KERNELS=$K PRECISIONS=$NEW08 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 \
    REQUESTS=20 bash scripts/h200.sh 0.8B $R/h bench > $R/h/chain-bench.log 2>&1
  log "rc-h-bench $?"; pack h
fi
env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/k validate > $R/k/chain-validate.log 2>&1
log "rc-k-validate $?"; pack k
if passed $R/k/validate-4B-$(name $NEW4).json; then
  env NO_HTTP_REFERENCE=1 KERNELS=$K PRECISIONS=$NEW4 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=batching \
    SERVE_ARGS=--instances=2 REQUESTS=20 bash scripts/h200.sh 4B $R/k bench > $R/k/chain-bench.log 2>&1
  log "rc-k-bench $?"; pack k
fi
log "chain done"
