#!/usr/bin/env bash
# Device chain (issues 16 and 17), written on 2026-12-06 (results: g in gpu-tests/, e in 0.8B/, h in
# 0.8B-http-batching/, n in 9B/): the rotary embedding's section interleaving as a selection
# (s1omni.export.rotary_sections), timed against the same build without it; the candidate heads begun during the forward (Vela2Model.early_candidates), timed against after it;
# and the 9B with the newest ops. No device machine came on 2026-12-06 (eleven tries); ran on 2026-12-07 on an H100 (chain.txt). Run with
# scripts/device.sh: start CHAIN (carry .device/p1), stage 2..6, the last with .device/ort-include copied to
# /tmp/ort-include, then poll "chain done"; name the record after the card.
#  g  tests/test_cuda_graphs.py on the GPU (the row gather's binding restructured since its last GPU run)
#  e  the 0.8B: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
#     built and validated (gpu-reduced); the same build without the selection (build_unselected.py); ab.py, four
#     arms (router, router@8; each arm profiled on both): without the selection and with the candidate heads after
#     the forward (as before both), with the selection and late candidates, with both, and with both capturing
#     calls of up to 16,384 tokens (router@8's prefill and span blocks too); then s1omni bench (router, backbone;
#     both references; the router profiled)
#  h  that engine over HTTP with `batching` and two instances, 1, 8 and 16 clients (added 2026-12-07: the load's
#     client is aiohttp's since benchmarks/cpu-http-client/, and every head now begins during the forward)
#  n  the 9B: bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16 (the 4B's), built,
#     validated and benched (router, backbone; both references); its early-vs-late A/B was left out on 2026-12-07
#     to fit the chain in the session's device time (the 0.8B's A/B answers that question)
# The 9B is synthesized, exported and built before anything is timed: nothing else loads the host during a timing.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
D=benchmarks/h100-rotary-selection
mkdir -p $R/g $R/e $R/h $R/n
K=ChunkedGatedDeltaRule
NEW08=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/norms/rotary/attn16
NEW9=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
ENGINE08=$S1OMNI_SCRATCH/engine-0.8B-$(name $NEW08)
# NEW08's flags (scripts/h200.sh build), without the selection
FLAGS08="--backend onnxruntime --target cuda --gated-delta-kernel $K --precision bf16 --cuda-graphs --gated-delta-inputs fp16
 --fused-mixers --bf16-convolutions --fused-short-convolutions --fused-convolution-heads --fused-delta-gates
 --fused-output-norms --fused-head-rotary --fused-silu --fused-residual-norms --fused-attention --attention-inputs fp16"
bash scripts/h200.sh 9B $R/n synth > $R/n/chain-synth.log 2>&1 & synth9=$!
bash scripts/h200.sh 0.8B $R/e synth > $R/e/chain-synth.log 2>&1; log "rc-e-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
log "headers staged"
(env GPU_TESTS="tests/test_cuda_graphs.py" PYTEST_ADDOPTS="-s" bash scripts/h200.sh 0.8B $R/g gpu-tests \
   > $R/g/chain.log 2>&1; log "rc-g $?"; pack g) & tests=$!
bash scripts/h200.sh 0.8B $R/e export > $R/e/chain-export.log 2>&1; log "rc-e-export $?"
wait $synth9; log "rc-n-synth $?"
(env KERNELS=$K PRECISIONS=$NEW9 bash scripts/h200.sh 9B $R/n export,build > $R/n/chain-export.log 2>&1
 log "rc-n-export-build $?") & build9=$!
env KERNELS=$K PRECISIONS=$NEW08 bash scripts/h200.sh 0.8B $R/e build,validate > $R/e/chain-validate.log 2>&1
log "rc-e-validate $?"
S1OMNI_HOME=$S1OMNI_WORK/home python3 $D/build_unselected.py $S1OMNI_SCRATCH/export-0.8B $FLAGS08 \
  --out $S1OMNI_SCRATCH/engine-0.8B-unselected > $R/e/build-unselected.log 2>&1; log "rc-e-unselected $?"; pack e
wait $tests $build9
if passed $R/e/validate-0.8B-$(name $NEW08).json; then
  S1OMNI_HOME=$S1OMNI_WORK/home python3 $D/ab.py --arm unselected=$S1OMNI_SCRATCH/engine-0.8B-unselected \
    --arm selected-late=$ENGINE08 --arm selected=$ENGINE08 --arm selected-16k=$ENGINE08 --unvalidated unselected \
    --late-candidates unselected --late-candidates selected-late --graph-tokens selected-16k=16384 \
    --workloads router,router@8 --profiled router,router@8 --profile-iterations 3 \
    --out $R/e/ab.json > $R/e/ab.log 2>&1
  log "rc-e-ab $?"; pack e
  env KERNELS=$K PRECISIONS=$NEW08 WORKLOADS=router,backbone REQUESTS=10 PROFILE=router \
    bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain-bench.log 2>&1; log "rc-e-bench $?"; pack e
  env KERNELS=$K PRECISIONS=$NEW08 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 \
    REQUESTS=20 bash scripts/h200.sh 0.8B $R/h bench > $R/h/chain-bench.log 2>&1; log "rc-h-bench $?"; pack h
fi
env KERNELS=$K PRECISIONS=$NEW9 bash scripts/h200.sh 9B $R/n validate > $R/n/chain-validate.log 2>&1
log "rc-n-validate $?"; pack n
if passed $R/n/validate-9B-$(name $NEW9).json; then
  env KERNELS=$K PRECISIONS=$NEW9 WORKLOADS=router,backbone REQUESTS=8 PROFILE=router \
    bash scripts/h200.sh 9B $R/n bench > $R/n/chain-bench.log 2>&1; log "rc-n-bench $?"; pack n
fi
log "chain done"
