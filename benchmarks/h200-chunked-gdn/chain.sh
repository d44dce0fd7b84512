#!/usr/bin/env bash
# Detached device chain, 2026-12-04 (issue 16: the ChunkedGatedDeltaRule op library). Run with scripts/device.sh:
#   start CHAIN (carry .device/p1 and the chain), stage 2..4, stage 5 with .device/ort-include copied to
#   /tmp/ort-include (ONNX Runtime's C API headers the op library compiles against), poll "chain done"
#  g  the suite's GPU tests of the op library and of every CUDA engine's gate (tiny member)
#  e  the 0.8B: bf16/graphs/gdn16/mixers/attn16 with ChunkedGatedDeltaRule and with GatedDeltaNet (ONNX Runtime's
#     own op), validated; the router and backbone workloads against both references, the router profiled on the
#     ChunkedGatedDeltaRule engine; e128: the same engine's 128-token backbone profiled
#  a  the 4B: the same two builds, validated; router and backbone, the router profiled
# Only GPU-light steps overlap; each bench runs alone on the machine.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/e128 $R/a
V=bf16/graphs/gdn16/mixers/attn16
K=ChunkedGatedDeltaRule,GatedDeltaNet
bash scripts/h200.sh 4B $R/a synth > $R/a/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
(env GPU_TESTS="tests/test_gdn_library.py tests/test_engine_pipeline.py" bash scripts/h200.sh 0.8B $R/g gpu-tests \
   > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
wait $synth4; log "rc-a-synth $?"  # waited for here, by the shell that started it
(bash scripts/h200.sh 4B $R/a export > $R/a/chain-export.log 2>&1; log "rc-a-export $?"
 for k in ${K//,/ }; do env KERNELS=$k PRECISIONS=$V bash scripts/h200.sh 4B $R/a build > $R/a/chain-build-$k.log 2>&1 & done
 wait; log "4B built") & build4=$!
env KERNELS=$K PRECISIONS=$V bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1; log "rc-e-validate $?"; pack e
wait $build4
env KERNELS=$K PRECISIONS=$V bash scripts/h200.sh 4B $R/a validate > $R/a/chain-validate.log 2>&1; log "rc-a-validate $?"; pack a
wait $tests
env KERNELS=$K PRECISIONS=$V WORKLOADS=router,backbone REQUESTS=10 PROFILE=router bash scripts/h200.sh 0.8B $R/e bench \
  > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
env KERNELS=$K PRECISIONS=$V WORKLOADS=router,backbone REQUESTS=8 PROFILE=router bash scripts/h200.sh 4B $R/a bench \
  > $R/a/chain-bench.log 2>&1; log "rc-a-bench $?"; pack a
env KERNELS=ChunkedGatedDeltaRule PRECISIONS=$V WORKLOADS=backbone REQUESTS=10 PROFILE=backbone-128 bash scripts/h200.sh 0.8B $R/e128 bench \
  > $R/e128/chain-bench.log 2>&1; log "rc-e128-bench $?"; pack e128
log "chain done"
