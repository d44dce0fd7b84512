#!/usr/bin/env bash
# Detached device chain 2, 2026-12-03 second session (issue 16: OmniJev-4B, the log-softmax in one op):
#  b  OmniJev-4B: synth, export, build bf16/graphs/gdn16/mixers/attn16, validate (gpu-reduced);
#     bench screenshot-1, screenshot-12 (3 requests after 1 warm-up: the device budget), profile screenshot-1
#  t  GPU test of the engine log-probs at the 4B table (beside the export: the GPU is idle then)
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
while [ ! -f /tmp/stage/env.sh ]; do sleep 1; done
source /tmp/stage/env.sh; log "staged"
(env GPU_TESTS="tests/omnijev/test_omnijev_vocabulary.py" bash scripts/h200.sh omnijev-4B $R/t gpu-tests > $R/t/chain.log 2>&1
 log "rc-t $?"; pack t) &
vt=$!
bash scripts/h200.sh omnijev-4B $R/b export > $R/b/chain-export.log 2>&1; log "rc-b-export $?"
wait $vt
V=bf16/graphs/gdn16/mixers/attn16
env PRECISIONS=$V bash scripts/h200.sh omnijev-4B $R/b build,validate > $R/b/chain-validate.log 2>&1; log "rc-b-validate $?"; pack b
if python3 -c "import json,sys; sys.exit(0 if json.load(open('$R/b/validate-omnijev-4B-GatedDeltaNet-bf16-graphs-gdn16-mixers-attn16.json'))['passed'] else 1)"; then
  env PRECISIONS=$V WORKLOADS=screenshot-1,screenshot-12 REQUESTS=3 WARMUP=1 PROFILE=screenshot-1 bash scripts/h200.sh omnijev-4B $R/b bench > $R/b/chain-bench.log 2>&1
  log "rc-b-bench $?"; pack b
fi
log "chain done"; touch /tmp/chain.done
