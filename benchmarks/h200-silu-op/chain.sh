#!/usr/bin/env bash
# Detached device chain, 2026-12-05 (issue 16): the SiLU-product op on a GPU for the first time.
# Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..5, stage 6 with .device/ort-include copied
# to /tmp/ort-include, poll "chain done".
#  g  the GPU tests of the op library (the SiluProduct op against its spelling; the Gated DeltaNet op, whose
#     loading and launching it now shares) and of the bench's reference memory release, beside e's synth/export
#  e  the 0.8B: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/attn16 without and with --fused-silu, and
#     merged with it; each validated; then timed in one run (router, router@8, backbone), the router profiled
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e
K=ChunkedGatedDeltaRule
BASE=bf16/graphs/gdn16/mixers/conv16/attn16
ALL=$BASE,bf16/graphs/gdn16/mixers/conv16/silu/attn16,bf16/graphs/gdn16/merged/mixers/conv16/silu/attn16
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_silu_products.py tests/test_gdn_library.py tests/test_bench_references.py" \
   bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $tests
env KERNELS=$K PRECISIONS=$ALL bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
env KERNELS=$K PRECISIONS=$ALL WORKLOADS=router,router@8,backbone REQUESTS=10 PROFILE=router \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
log "chain done"
