#!/usr/bin/env bash
# Detached device chain, 2026-12-02 fifth session:
#  g  0.8B bf16/graphs/gdn16/mixers on HEAD: synth, export, build, validate (gpu-reduced), shared (gpu-reduced-alone)
#  p  in process: router, router@4, router@8 (the forward batching runs for 4 and 8 requests), profiled at router@8
#  q  the same engine copied, validated and timed with ORT_GDN_PLAN=chunked (the fused float32-state engine
#     pinned; ORT's heuristic takes chunked_split where the grid underfills the GPU)
#  f  4B bf16/graphs/gdn16/mixers: synth, export, build, validate; then over HTTP 1/8/16 clients exact --instances 3
#  i  (0.8B) over HTTP, 8 and 16 clients: exact, --instances 4
set -u
source /tmp/stage/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/chain/fla/*.whl
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
R=/tmp/res; mkdir -p $R/g $R/p $R/q $R/i $R/f $R/f2
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; echo "== $(date -u +%T) packed $1"; }
nvidia-smi > $R/g/nvidia-smi.txt 2>&1
P=bf16/graphs/gdn16/mixers
E=/dev/shm/w/engine-0.8B-GatedDeltaNet-bf16-graphs-gdn16-mixers
cp .device/chain/run.sh $R/g/chain.sh
env PRECISIONS=$P bash scripts/h200.sh 0.8B $R/g synth,export,build,validate,shared > $R/g/chain.log 2>&1
echo "rc-g $?" >> $R/g/chain.txt; pack g
env PRECISIONS=$P WORKLOADS=router,router@4,router@8 REQUESTS=12 PROFILE=router@8 \
  bash scripts/h200.sh 0.8B $R/p bench > $R/p/chain.log 2>&1
echo "rc-p $?" >> $R/p/chain.txt; pack p
cp -a $E $E-chunked
( export ORT_GDN_PLAN=chunked
  python3 -m s1omni validate $E-chunked --package /tmp/w/vela2-0.8B --reference /tmp/w/reference-0.8B --reference-device cuda \
    --report $R/q/validate-0.8B-chunked.json > $R/q/validate-0.8B-chunked.txt 2> $R/q/validate-0.8B-chunked.log
  echo "rc-validate $?"
  python3 -m s1omni bench --package /tmp/w/vela2-0.8B --engine $E-chunked --device cuda --workloads router,router@8 \
    --requests 12 --warmup 2 --profile router --out $R/q 2> $R/q/bench-0.8B.log
  echo "rc-bench $?" ) > $R/q/chain.txt 2>&1
rm -rf $E-chunked; pack q
rm -rf /dev/shm/w/export-0.8B
env PRECISIONS=$P bash scripts/h200.sh 4B $R/f synth,export,build,validate > $R/f/chain.log 2>&1
echo "rc-f-build $?" >> $R/f/chain.txt; pack f
env PRECISIONS=$P WORKLOADS=router REQUESTS=20 HTTP=1,8,16 HTTP_PROFILE=exact SERVE_ARGS=--instances=3 \
  bash scripts/h200.sh 4B $R/f2 bench > $R/f2/chain.log 2>&1
echo "rc-f2 $?" >> $R/f2/chain.txt; pack f2
env PRECISIONS=$P WORKLOADS=router REQUESTS=20 HTTP=8,16 HTTP_PROFILE=exact SERVE_ARGS=--instances=4 \
  bash scripts/h200.sh 0.8B $R/i bench > $R/i/chain.log 2>&1
echo "rc-i $?" >> $R/i/chain.txt; pack i
echo "== $(date -u +%T) chain done"; touch /tmp/chain.done
