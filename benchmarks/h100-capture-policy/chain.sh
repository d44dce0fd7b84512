#!/usr/bin/env bash
# Device chain (issue 17), run on 2026-12-07 on an NVIDIA H100 80GB HBM3 (chain.txt; t in gpu-tests/, h in
# 0.8B-http-batching/, k in 4B-http-batching/, its serve log cut after the first failures). It checked and measured
# the capture policy of 2b57668 (a CUDA graph captured only where no other forward runs on the GPU, refused at once
# otherwise, the run going outside any graph; since replaced, runtime/runners/capture_lock.py says why): in h100-host-gil's 0.8B-http-batching
# the first forward of each merged size on each of the two instances took 1.0-4.7 s (14 such forwards, 25.7 s; a
# merged router forward of a new size brings 7-9 new graphs, each captured after its warm-up runs and a wait for the
# other instance's forward), and after the last of them the server answered about 49 req/s at 16 clients against the
# level's 40.35.
#  t  the GPU tests: two instances of a CUDA-graph engine answering merged batches at 16 clients
#     (tests/server/test_server_instances.py), and the CUDA tests of tests/test_cuda_graphs.py
#  h  the 0.8B (h100-host-gil's build) built, validated, served with `batching` and two instances at 1, 8 and 16
#     clients, the reference server last, as h100-host-gil's h; `server_cpu.cuda_graphs` gives each level's captures
#     and deferred runs
#  k  the 4B (h100-host-gil's k: .../heads/gates/onorms/silu/rotary/attn16) synthesized, exported and built while the
#     0.8B validates (done before anything is timed), validated, served as h without the reference server (it answers
#     about 1.5 router requests a second, h200-4B-http: 20 a client at 1, 8 and 16 clients would take 5.5 minutes)
# Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..7 (the last with .device/ort-include copied
# to /tmp/ort-include), poll "chain done". $GPU_TESTS, if set, names other test files for t (benchmarks/h100-forward-alone
# runs this chain again that way).
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
GPU_TESTS=${GPU_TESTS:-"tests/server/test_server_instances.py tests/test_cuda_graphs.py tests/test_capture_lock.py"} \
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
