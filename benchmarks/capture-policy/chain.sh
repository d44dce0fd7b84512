#!/usr/bin/env bash
# Device chain (issue 17), written on 2026-12-07, not yet run (the session's device time was spent). It checks and
# measures the capture policy of runtime/runners/capture_lock.py (a CUDA graph is captured only where no other forward
# runs on the GPU, refused at once otherwise, the run going outside any graph): in h100-host-gil's 0.8B-http-batching
# the first forward of each merged size on each of the two instances took 1.0-4.7 s (14 such forwards, 25.7 s; a
# merged router forward of a new size brings 7-9 new graphs, each captured after its warm-up runs and a wait for the
# other instance's forward), and after the last of them the server answered about 49 req/s at 16 clients against the
# level's 40.35.
#  t  the GPU tests: two instances of a CUDA-graph engine answering merged batches at 16 clients
#     (tests/server/test_server_instances.py), and the CUDA tests of tests/test_cuda_graphs.py
#  h  the 0.8B (h100-host-gil's build) built, validated, served with `batching` and two instances at 1, 8 and 16
#     clients, the reference server last, as h100-host-gil's h; `server_cpu.cuda_graphs` gives each level's captures
#     and deferred runs
# Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..7 (the last with .device/ort-include copied
# to /tmp/ort-include), poll "chain done". Rename the folder after the card.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/t $R/h
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
bash scripts/h200.sh 0.8B $R/h synth > $R/h/chain-synth.log 2>&1; log "rc-h-synth $?"
wait_for_wheels
GPU_TESTS="tests/server/test_server_instances.py tests/test_cuda_graphs.py tests/test_capture_lock.py" \
  bash scripts/h200.sh 0.8B $R/t gpu-tests > $R/t/chain-gpu-tests.log 2>&1
log "rc-t-gpu-tests $?"; pack t
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/h export,build,validate > $R/h/chain-validate.log 2>&1
log "rc-h-validate $?"; pack h
if passed $R/h/validate-0.8B-$K-$(echo $NEW08 | tr / -).json; then
  env KERNELS=$K PRECISIONS=$NEW08 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 \
    REQUESTS=20 bash scripts/h200.sh 0.8B $R/h bench > $R/h/chain-bench.log 2>&1
  log "rc-h-bench $?"; pack h
fi
log "chain done"
