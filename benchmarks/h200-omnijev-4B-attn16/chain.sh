#!/usr/bin/env bash
# Detached device chain, 2026-12-03 second session (issue 16: OmniJev-4B on HEAD):
#  b  OmniJev-4B: synth, export, build bf16/graphs/gdn16/mixers (last record's engine; its log-probabilities now in
#     the EP) and the same with the vision and language attention as one float16 op (attn16); validate both
#     (gpu-reduced); GPU tests (EP log-probs at the 4B table, the OmniJev engine, the fused attention);
#     bench the passed ones: screenshot-1, screenshot-12 (5 requests), profile screenshot-1 on the first passed
#  c  screenshot-255 on the attn16 engine (1 request after 1 warm-up: the references take ~40 s a request)
set -u
repo=$(cat /tmp/chain/repo); cd "$repo"
R=/tmp/res; mkdir -p $R/b $R/c $R/t
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%T) $*" >> $R/chain.txt; }
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; log "packed $1"; }
cp /tmp/chain/run.sh $R/b/chain.sh
nvidia-smi > $R/b/nvidia-smi.txt 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $R/pip.log 2>&1; log "installed rc $?"
bash scripts/h200.sh omnijev-4B $R/b synth > $R/b/chain-synth.log 2>&1; log "rc-b-synth $?"
while [ ! -f /tmp/stage/env.sh ]; do sleep 3; done
source /tmp/stage/env.sh; log "staged"
python3 -c "import onnxruntime; print('staged onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())" >> $R/chain.txt 2>&1
bash scripts/h200.sh omnijev-4B $R/b export > $R/b/chain-export.log 2>&1; log "rc-b-export $?"
V=bf16/graphs/gdn16/mixers,bf16/graphs/gdn16/mixers/attn16
env PRECISIONS=$V bash scripts/h200.sh omnijev-4B $R/b build > $R/b/chain-build.log 2>&1; log "rc-b-build $?"
env PRECISIONS=$V bash scripts/h200.sh omnijev-4B $R/b validate > $R/b/chain-validate.log 2>&1; log "rc-b-validate $?"
passed=$(for p in ${V//,/ }; do n=GatedDeltaNet-bf16-$(echo "${p#bf16/}" | tr / -)
  python3 -c "import json,sys; sys.exit(0 if json.load(open('$R/b/validate-omnijev-4B-$n.json'))['passed'] else 1)" 2>/dev/null && printf '%s,' "$p"; done)
passed=${passed%,}; log "b passed: $passed"; pack b
env GPU_TESTS="tests/omnijev/test_omnijev_vocabulary.py tests/omnijev/test_omnijev_engine.py tests/test_attention_fusions.py" \
  bash scripts/h200.sh omnijev-4B $R/t gpu-tests > $R/t/chain.log 2>&1; log "rc-t $?"; pack t
if [ -n "$passed" ]; then
  env PRECISIONS=$passed WORKLOADS=screenshot-1,screenshot-12 REQUESTS=5 PROFILE=screenshot-1 bash scripts/h200.sh omnijev-4B $R/b bench > $R/b/chain-bench.log 2>&1
  log "rc-b-bench $?"; pack b
  last=${passed##*,}
  env PRECISIONS=$last WORKLOADS=screenshot-255 REQUESTS=1 WARMUP=1 PROFILE= bash scripts/h200.sh omnijev-4B $R/c bench > $R/c/chain-bench.log 2>&1
  log "rc-c-bench $?"; pack c
fi
log "chain done"; touch /tmp/chain.done
