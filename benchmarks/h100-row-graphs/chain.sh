#!/usr/bin/env bash
# Device chain (issues 16 and 17), written and run on an H100 on 2026-12-06 (results: g in gpu-tests/, e in 0.8B/, f in 4B/):
# the state-row gather captured as CUDA graphs, timed against plain runs of it on the best validated builds. Run with
# scripts/device.sh: start CHAIN (carry .device/p1), stage 2..6, the last with .device/ort-include copied to /tmp/ort-include,
# then poll "chain done"; name the record after the card that ran it.
#  g  tests/test_output_norms.py (its unit model's reshape fixed since its last GPU run) and tests/test_cuda_graphs.py (the
#     row graphs captured and replayed with new inputs) on the GPU
#  e  the 0.8B: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16 built
#     and validated (gpu-reduced), ab.py (plain against captured row gathers, router and router@8, each arm profiled), then
#     timed (router, backbone; both references; the router profiled, the device's idle time included)
#  f  the 4B: the same with bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16 (ab.py on the router)
# The 4B is synthesized, exported and built before anything is timed: nothing else loads the host during a timing.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/f
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
ab() {  # ab SIZE PRECISION OUT WORKLOADS: ab.py on that engine if it passed its gate
  passed $R/$3/validate-$1-$(name "$2").json || return 0
  S1OMNI_HOME=$S1OMNI_WORK/home python3 benchmarks/h100-row-graphs/ab.py --engine "$S1OMNI_SCRATCH/engine-$1-$(name "$2")" \
    --workloads "$4" --out $R/$3/ab.json > $R/$3/ab.log 2>&1; log "rc-$3-ab $?"; pack "$3"
}
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_output_norms.py tests/test_cuda_graphs.py" PYTEST_ADDOPTS="-s" bash scripts/h200.sh 0.8B $R/g gpu-tests \
   > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-f-synth $?"
(env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/f export,build > $R/f/chain-export.log 2>&1
 log "rc-f-export-build $?") & build4=$!
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
wait $tests $build4
env KERNELS=$K PRECISIONS=$NEW4 bash scripts/h200.sh 4B $R/f validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
ab 0.8B $NEW08 e router,router@8
if passed $R/e/validate-0.8B-$(name $NEW08).json; then
  env KERNELS=$K PRECISIONS=$NEW08 WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
    bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
fi
ab 4B $NEW4 f router
if passed $R/f/validate-4B-$(name $NEW4).json; then
  env KERNELS=$K PRECISIONS=$NEW4 WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
    bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
fi
log "chain done"
