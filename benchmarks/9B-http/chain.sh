#!/usr/bin/env bash
# Device chain (issue 17), written on 2026-12-07, not yet run: the 9B served over HTTP, which no record has yet
# (target: >= 10 router requests a second at 16 clients). With one copy of the weights a process
# (runtime/runners/device_weights.py) two instances of the 9B hold its 18 GB of bfloat16 weights once instead of six
# times (108 GB: more than an H100 or an H200 has). About 16 minutes: synth 106 s, export 92 s, build 310 s, validate
# 90 s on the H200 (scripts/h200.sh's figures), then the three levels.
#  n  the 9B (h100-rotary-selection's n: ChunkedGatedDeltaRule bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/
#     onorms/silu/rotary/attn16) built, validated, served with `batching` and two instances at 1, 8 and 16 clients,
#     in process and over HTTP, without the reference server (its router request takes about 0.55 s with FLA:
#     h100-rotary-selection)
# Run with scripts/device.sh: start CHAIN (carry DIR/p1), stage 2..N (the last with .device/ort-include copied to
# /tmp/ort-include), poll "chain done". Rename the folder after the card.
set -u
source scripts/device-chain.sh
export S1OMNI_ORT_INCLUDE=/tmp/ort-include
mkdir -p $R/n
K=ChunkedGatedDeltaRule
NEW9=bf16/graphs/gdn16/mixers/conv16/convop/heads/gates/onorms/silu/rotary/attn16
name() { echo "$K-$(echo "$1" | tr / -)"; }
bash scripts/h200.sh 9B $R/n synth > $R/n/chain-synth.log 2>&1; log "rc-n-synth $?"
wait_for_wheels
while [ ! -f $S1OMNI_ORT_INCLUDE/onnxruntime_c_api.h ]; do sleep 1; done
env KERNELS=$K PRECISIONS=$NEW9 bash scripts/h200.sh 9B $R/n export,build,validate > $R/n/chain-validate.log 2>&1
log "rc-n-validate $?"; pack n
if passed $R/n/validate-9B-$(name $NEW9).json; then
  env NO_HTTP_REFERENCE=1 KERNELS=$K PRECISIONS=$NEW9 WORKLOADS=router PROFILE= HTTP=1,8,16 HTTP_PROFILE=batching \
    SERVE_ARGS=--instances=2 REQUESTS=20 bash scripts/h200.sh 9B $R/n bench > $R/n/chain-bench.log 2>&1
  log "rc-n-bench $?"; pack n
fi
log "chain done"
