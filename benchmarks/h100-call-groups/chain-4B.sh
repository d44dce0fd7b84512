#!/usr/bin/env bash
# Second device chain of 2026-12-06 (issue 16), after chain.sh's 4B bench was lost with the machine: run with
# scripts/device.sh as chain.sh is (start, stage 2..6 with .device/ort-include, poll "chain done").
#  g2  tests/test_delta_gates.py and tests/test_output_norms.py on the GPU again, after chain.sh's g found the output
#      norm's rewrite naming its rows as the cast it replaced and the delta gates' end-to-end check over its mean bound
#  f2  the 4B: bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16 and it with /gates/onorms/rotary, built, validated
#      and both timed in one run (router, backbone; both references; the router profiled)
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g2 $R/f2
K=ChunkedGatedDeltaRule
BASE4=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
bash scripts/h200.sh 4B $R/f2 synth > $R/f2/chain-synth.log 2>&1; log "rc-f2-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_delta_gates.py tests/test_output_norms.py" PYTEST_ADDOPTS="-s" bash scripts/h200.sh 0.8B $R/g2 gpu-tests \
   > $R/g2/chain.log 2>&1; log "rc-g2 $?"; pack g2) & tests=$!
env KERNELS=$K PRECISIONS=$NEW4,$BASE4 bash scripts/h200.sh 4B $R/f2 export,build,validate > $R/f2/chain-validate.log 2>&1
log "rc-f2-validate $?"; pack f2
kept=()
for precision in $NEW4 $BASE4; do
  if passed $R/f2/validate-4B-$(name $precision).json; then kept+=("$precision"); fi
done
env KERNELS=$K PRECISIONS=$(IFS=,; echo "${kept[*]}") WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
  bash scripts/h200.sh 4B $R/f2 bench > $R/f2/chain-bench.log 2>&1; log "rc-f2-bench $?"; pack f2
wait $tests
log "chain done"
