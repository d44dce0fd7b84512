#!/usr/bin/env bash
# Detached device chain (issue 16), written 2026-12-06, run on an H100 the same day (chain.txt; results: g in gpu-tests/, e in 0.8B/,
# f in 4B-validate/; the machine went back before f's ab.py and bench, which chain-4B.sh ran again). Run with
# scripts/device.sh: start CHAIN (carry .device/p1), stage 2..6, the last with .device/ort-include copied to
# /tmp/ort-include, then poll "chain done" in as few calls as the time allows; name the record after the card that ran it.
#  g  tests/test_delta_gates.py, test_output_norms.py and test_head_rotary.py on the GPU: each op against float64 and against ONNX
#     Runtime's nodes, timed beside them; the tiny member's rewritten graphs end to end on the CUDA EP
#  e  the 0.8B: the best validated build (ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/norms/attn16)
#     and it with /gates/onorms/rotary (--fused-delta-gates --fused-output-norms --fused-head-rotary), each validated, then
#     ab.py on the latter (the
#     runner's blocks grouped for fewer continue calls: call costs 0, 512 and 1,024 in turn, one process; set
#     DEFAULT_CALL_COST_TOKENS to the cost to serve before a run that validates with it), then both timed in one run
#     (router, backbone; both references; the router profiled)
#  f  the 4B: bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16 and it with /gates/onorms/rotary: the same (ab.py on the
#     router alone)
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/f
K=ChunkedGatedDeltaRule
BASE08=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/norms/attn16
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
BASE4=bf16/graphs/gdn16/mixers/conv16/convop/heads/silu/attn16
NEW4=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
ab() {  # ab SIZE PRECISION OUT WORKLOADS: ab.py on that engine if it passed its gate
  passed $R/$3/validate-$1-$(name "$2").json || return 0
  S1OMNI_HOME=$S1OMNI_WORK/home python3 benchmarks/h100-call-groups/ab.py --engine "$S1OMNI_SCRATCH/engine-$1-$(name "$2")" \
    --workloads "$4" --out $R/$3/ab.json > $R/$3/ab.log 2>&1; log "rc-$3-ab $?"; pack "$3"
}
validated() {  # validated SIZE OUT P1 P2: those of the precisions whose engine passed its gate, comma-separated
  local size=$1 out=$2 kept=() precision; shift 2
  for precision in "$@"; do if passed $R/$out/validate-$size-$(name "$precision").json; then kept+=("$precision"); fi; done
  (IFS=,; echo "${kept[*]}")
}
bash scripts/h200.sh 4B $R/f synth > $R/f/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_delta_gates.py tests/test_output_norms.py tests/test_head_rotary.py" PYTEST_ADDOPTS="-s" bash scripts/h200.sh 0.8B $R/g gpu-tests \
   > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-f-synth $?"
(env KERNELS=$K PRECISIONS=$NEW4,$BASE4 bash scripts/h200.sh 4B $R/f export,build > $R/f/chain-export.log 2>&1
 log "rc-f-export-build $?") & build4=$!
env KERNELS=$K PRECISIONS=$NEW08,$BASE08 bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"; pack e
wait $tests $build4
ab 0.8B $NEW08 e router,router@8
env KERNELS=$K PRECISIONS=$(validated 0.8B e $NEW08 $BASE08) WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
env KERNELS=$K PRECISIONS=$NEW4,$BASE4 bash scripts/h200.sh 4B $R/f validate > $R/f/chain-validate.log 2>&1
log "rc-f-validate $?"; pack f
ab 4B $NEW4 f router
env KERNELS=$K PRECISIONS=$(validated 4B f $NEW4 $BASE4) WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
  bash scripts/h200.sh 4B $R/f bench > $R/f/chain-bench.log 2>&1; log "rc-f-bench $?"; pack f
log "chain done"
