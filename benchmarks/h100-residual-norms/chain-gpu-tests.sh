#!/usr/bin/env bash
# Detached device chain, 2026-12-05 (issue 16): the residual-norm op on a GPU for the first time, and the SiLU op's
# GPU test judged against the exact product. It ran on an H100 80GB (sm_90) as far as g (chain.txt: 13 GPU tests
# passed, gpu-tests/); the machine went back between two polls while e was building, taking e and f with it;
# chain.sh then ran e alone. Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..5,
# stage 6 with .device/ort-include copied to /tmp/ort-include, poll "chain done".
#  g  the GPU tests of both ops (tests/test_silu_products.py, tests/test_residual_norms.py), beside e's synth/export
#  e  the 0.8B: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/silu/attn16 with and without
#     --fused-residual-norms, each validated, then timed in one run (router, backbone), the first profiled
#  f  the 4B: the faster build that passed on the 0.8B, validated and timed (router, backbone), profiled
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/f
K=ChunkedGatedDeltaRule
NORMS=bf16/graphs/gdn16/mixers/conv16/silu/norms/attn16
SILU=bf16/graphs/gdn16/mixers/conv16/silu/attn16
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_silu_products.py tests/test_residual_norms.py" \
   bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-f-synth $?"
(bash scripts/h200.sh 4B $R/f export > $R/f/chain-export.log 2>&1; log "rc-f-export $?") & export4=$!
wait $tests
env KERNELS=$K PRECISIONS=$NORMS,$SILU bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
wait $export4
env KERNELS=$K PRECISIONS=$NORMS,$SILU WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
BEST=$SILU
if passed $R/e/validate-0.8B-$K-bf16-graphs-gdn16-mixers-conv16-silu-norms-attn16.json; then BEST=$NORMS; fi
env KERNELS=$K PRECISIONS=$BEST bash scripts/h200.sh 4B $R/f build,validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
env KERNELS=$K PRECISIONS=$BEST WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
  bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
log "chain done"
