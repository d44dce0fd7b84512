#!/usr/bin/env bash
# Detached device chain, 2026-12-03 session (issue 16: the attention as one float16 op; OmniJev-4B's first H200 run):
#  a  0.8B: synth, export, build bf16/graphs/gdn16/mixers (the last record's engine), the same with
#     --fused-attention --attention-inputs fp16 (attn16) and with it in float32 (attn, keys now padded);
#     validate each (gpu-reduced); bench the passed ones in process: backbone, router, router@8, profile router
#  b  OmniJev-4B: synth, export, build bf16/graphs/gdn16/mixers, validate, bench screenshot-1/12/255
#  t  GPU tests: the fused attention on the CUDA EP, OmniJev's reference on the GPU
#  Then, by hand after it (the device budget): the 255-option OmniJev bench stopped, and in its place
#    PRECISIONS=bf16/graphs/gdn16/mixers WORKLOADS=screenshot-1,screenshot-12 REQUESTS=3 PROFILE=screenshot-1 scripts/h200.sh omnijev-4B OUT bench
#    PRECISIONS=bf16/graphs/gdn16/mixers/attn16 WORKLOADS=router,router@8 REQUESTS=4 PROFILE=router@8 scripts/h200.sh 0.8B OUT bench  (router8-profile/)
set -u
repo=$(cat /tmp/chain/repo); cd "$repo"
R=/tmp/res; mkdir -p $R/a $R/b $R/t
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%T) $*" >> $R/chain.txt; }
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; log "packed $1"; }
cp /tmp/chain/run.sh $R/a/chain.sh
nvidia-smi > $R/a/nvidia-smi.txt 2>&1
python3 -c "import onnxruntime, torch; print('image onnxruntime', onnxruntime.__version__, 'torch', torch.__version__)" >> $R/chain.txt 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . > $R/pip.log 2>&1; log "installed rc $?"
(bash scripts/h200.sh 0.8B $R/a synth > $R/a/chain-synth.log 2>&1; log "rc-a-synth $?") &
sa=$!
(bash scripts/h200.sh omnijev-4B $R/b synth > $R/b/chain-synth.log 2>&1; log "rc-b-synth $?") &
sb=$!
while [ ! -f /tmp/stage/env.sh ]; do sleep 3; done
source /tmp/stage/env.sh; log "staged"
python3 -c "import onnxruntime; print('staged onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())" >> $R/chain.txt 2>&1
wait $sa
bash scripts/h200.sh 0.8B $R/a export > $R/a/chain-export.log 2>&1; log "rc-a-export $?"
wait $sb
(bash scripts/h200.sh omnijev-4B $R/b export > $R/b/chain-export.log 2>&1; log "rc-b-export $?"
 env PRECISIONS=bf16/graphs/gdn16/mixers bash scripts/h200.sh omnijev-4B $R/b build,validate > $R/b/chain-validate.log 2>&1; log "rc-b-validate $?"
 pack b) &
vb=$!
V=bf16/graphs/gdn16/mixers,bf16/graphs/gdn16/mixers/attn16,bf16/graphs/gdn16/mixers/attn
env PRECISIONS=$V bash scripts/h200.sh 0.8B $R/a build > $R/a/chain-build.log 2>&1; log "rc-a-build $?"
(env GPU_TESTS="tests/test_attention_fusions.py tests/omnijev/test_omnijev_model.py" bash scripts/h200.sh 0.8B $R/t gpu-tests > $R/t/chain.log 2>&1
 log "rc-t $?"; pack t) &
vt=$!
env PRECISIONS=$V bash scripts/h200.sh 0.8B $R/a validate > $R/a/chain-validate.log 2>&1; log "rc-a-validate $?"
passed=$(for p in ${V//,/ }; do n=GatedDeltaNet-bf16-$(echo "${p#bf16/}" | tr / -)
  python3 -c "import json,sys; sys.exit(0 if json.load(open('$R/a/validate-0.8B-$n.json'))['passed'] else 1)" 2>/dev/null && printf '%s,' "$p"; done)
passed=${passed%,}; log "a passed: $passed"; pack a
wait $vb $vt
if [ -n "$passed" ]; then
  env PRECISIONS=$passed WORKLOADS=backbone,router,router@8 REQUESTS=10 PROFILE=router bash scripts/h200.sh 0.8B $R/a bench > $R/a/chain-bench.log 2>&1
  log "rc-a-bench $?"; pack a
fi
if python3 -c "import json,sys; sys.exit(0 if json.load(open('$R/b/validate-omnijev-4B-GatedDeltaNet-bf16-graphs-gdn16-mixers.json'))['passed'] else 1)"; then
  env PRECISIONS=bf16/graphs/gdn16/mixers REQUESTS=8 bash scripts/h200.sh omnijev-4B $R/b bench > $R/b/chain-bench.log 2>&1
else
  env PRECISIONS=bf16/graphs/gdn16/mixers REQUESTS=8 ALLOW_UNVALIDATED=1 bash scripts/h200.sh omnijev-4B $R/b bench > $R/b/chain-bench.log 2>&1
fi
log "rc-b-bench $?"; pack b
log "chain done"; touch /tmp/chain.done
