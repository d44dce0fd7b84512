#!/usr/bin/env bash
# Detached device chain, 2026-12-02:
#  A  0.8B synth/export, gpu-tests, bf16/graphs/gdn16/mixers and .../mixers/attn build+gate+merged
#     beside it: 4B synth/export/build (bf16/graphs/gdn16/mixers)
#  B  4B gate + in-process bench (backbone, router; profile router)
#  C  0.8B bench in process and over HTTP (batching, --instances 2) on the engines that passed
set -u
source /tmp/stage/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/chain/fla/*.whl
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
R=/tmp/res; mkdir -p $R/a $R/m $R/f $R/g $R/b
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; echo "== $(date -u +%T) packed $1"; }
nvidia-smi > $R/a/nvidia-smi.txt 2>&1
( bash scripts/h200.sh 4B $R/f synth,export > $R/f/chain.log 2>&1
  env PRECISIONS=bf16/graphs/gdn16/mixers bash scripts/h200.sh 4B $R/f build >> $R/f/chain.log 2>&1
  echo "rc-f $?" >> $R/f/chain.txt ) &
four=$!
bash scripts/h200.sh 0.8B $R/a synth,export > $R/a/chain.log 2>&1
bash scripts/h200.sh 0.8B $R/a gpu-tests >> $R/a/chain.log 2>&1; echo "rc-a $?" >> $R/a/chain.txt; pack a
ok=""
for p in bf16/graphs/gdn16/mixers bf16/graphs/gdn16/mixers/attn; do
  n=$(echo $p | tr / -)
  env PRECISIONS=$p bash scripts/h200.sh 0.8B $R/m build,validate > $R/m/chain-$n.log 2>&1 && ok="${ok:+$ok,}$p"
done
env PRECISIONS=${ok:-bf16/graphs/gdn16/mixers} bash scripts/h200.sh 0.8B $R/m merged >> $R/m/chain-merged.log 2>&1
echo "ok=$ok" >> $R/m/chain.txt; pack m
wait $four; pack f
env PRECISIONS=bf16/graphs/gdn16/mixers bash scripts/h200.sh 4B $R/g validate > $R/g/chain.log 2>&1 \
  && env PRECISIONS=bf16/graphs/gdn16/mixers WORKLOADS=backbone,router REQUESTS=20 PROFILE=router \
       bash scripts/h200.sh 4B $R/g bench >> $R/g/chain.log 2>&1
echo "rc-g $?" >> $R/g/chain.txt; pack g
if [ -n "$ok" ]; then
  env PRECISIONS=$ok WORKLOADS=backbone,router REQUESTS=20 PROFILE=router HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 \
    bash scripts/h200.sh 0.8B $R/b bench > $R/b/chain.log 2>&1
  echo "rc-b $?" >> $R/b/chain.txt; pack b
fi
echo "== $(date -u +%T) chain done"; touch /tmp/chain.done
