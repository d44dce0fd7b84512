#!/usr/bin/env bash
# Detached device chain, 2026-12-04 (issue 16: short convolutions in bfloat16, the span head begun during the forward;
# issue 17: the same engine over HTTP). Run with scripts/device.sh: start CHAIN (carry .device/p1), stage 2..4, stage 5
# with .device/ort-include copied to /tmp/ort-include, poll "chain done".
#  g  the suite's GPU tests of the rewrite (tests/test_bf16_convolutions.py: the CUDA EP against the CPU's emulation)
#  e  the 0.8B: ChunkedGatedDeltaRule at bf16/graphs/gdn16/mixers/attn16 (last record's engine), + /conv16, + /merged too;
#     each validated; the validated ones timed on the router and backbone workloads against both references, the router
#     profiled on the first (merged+conv16); then the best over HTTP at 1, 8 and 16 clients beside the reference server
#  a  the 4B: the last record's engine and merged+conv16, validated, timed, the router profiled
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/g $R/e $R/a $R/h
K=ChunkedGatedDeltaRule
BASE=bf16/graphs/gdn16/mixers/attn16 CONV=bf16/graphs/gdn16/mixers/conv16/attn16 BOTH=bf16/graphs/gdn16/merged/mixers/conv16/attn16
SUFFIXES=(unfused graphs gdn16 merged mixers conv16 attn attn16 vgraphs)  # as scripts/h200.sh names its engines
has() { [[ "/$1/" == *"/$2/"* ]]; }
variant_name() { local n=$K-${1%%/*} s; for s in "${SUFFIXES[@]}"; do if has "$1" "$s"; then n+="-$s"; fi; done; echo "$n"; }
validated() {  # the variants in $3 (comma-separated) whose validation report in $2 passed, for size $1
  local kept=() v
  for v in ${3//,/ }; do if passed "$2/validate-$1-$(variant_name "$v").json"; then kept+=("$v"); fi; done
  local IFS=,; echo "${kept[*]}"
}
bash scripts/h200.sh 4B $R/a synth > $R/a/chain-synth.log 2>&1 & synth4=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_bf16_convolutions.py" bash scripts/h200.sh 0.8B $R/g gpu-tests > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth4; log "rc-a-synth $?"
(bash scripts/h200.sh 4B $R/a export > $R/a/chain-export.log 2>&1; log "rc-a-export $?"
 env KERNELS=$K PRECISIONS=$BOTH,$BASE bash scripts/h200.sh 4B $R/a build > $R/a/chain-build.log 2>&1; log "rc-a-build $?") & build4=$!
env KERNELS=$K PRECISIONS=$BOTH,$CONV,$BASE bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1; log "rc-e-validate $?"; pack e
wait $tests
E=$(validated 0.8B $R/e $BOTH,$CONV,$BASE); log "0.8B validated: $E"
[ -z "$E" ] || { env KERNELS=$K PRECISIONS=$E WORKLOADS=router,backbone REQUESTS=10 PROFILE=router bash scripts/h200.sh 0.8B $R/e bench \
  > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e; }
wait $build4
env KERNELS=$K PRECISIONS=$BOTH,$BASE bash scripts/h200.sh 4B $R/a validate > $R/a/chain-validate.log 2>&1; log "rc-a-validate $?"; pack a
A=$(validated 4B $R/a $BOTH,$BASE); log "4B validated: $A"
[ -z "$A" ] || { env KERNELS=$K PRECISIONS=$A WORKLOADS=router,backbone REQUESTS=8 PROFILE=router bash scripts/h200.sh 4B $R/a bench \
  > $R/a/chain-bench.log 2>&1; log "rc-a-bench $?"; pack a; }
H=${E%%,*}
[ -z "$H" ] || { env KERNELS=$K PRECISIONS=$H WORKLOADS=router PROFILE= HTTP=1,8,16 REQUESTS=20 bash scripts/h200.sh 0.8B $R/h bench \
  > $R/h/chain-bench.log 2>&1; log "rc-h-bench $?"; pack h; }
log "chain done"
