#!/usr/bin/env bash
# Detached device chain, 2026-12-02 third session:
#  s  0.8B bf16/graphs/gdn16/mixers: synth, export, build, validate (gpu-reduced), merged 8 and shared_context at
#     gpu-reduced-alone; in process: router and all-kinds-one-row, exact and :shared_context (packed calls now CUDA graphs)
#  h  over HTTP, 1/8/16 clients, 20 requests each after warm-up: batching with --instances 2 (the share cap re-measured)
#  c  over HTTP, 1/8/16 clients: shared_context
set -u
source /tmp/stage/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/chain/fla/*.whl
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
R=/tmp/res; mkdir -p $R/s $R/h $R/c
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; echo "== $(date -u +%T) packed $1"; }
nvidia-smi > $R/s/nvidia-smi.txt 2>&1
P=bf16/graphs/gdn16/mixers
cp .device/chain/run.sh $R/s/chain.sh
env PRECISIONS=$P MERGED=8 bash scripts/h200.sh 0.8B $R/s synth,export,build,validate,merged,shared > $R/s/chain.log 2>&1
echo "rc-s $?" >> $R/s/chain.txt
env PRECISIONS=$P WORKLOADS=router,router:shared_context,all-kinds-one-row,all-kinds-one-row:shared_context REQUESTS=20 PROFILE=router \
  bash scripts/h200.sh 0.8B $R/s bench >> $R/s/chain.log 2>&1
echo "rc-b $?" >> $R/s/chain.txt; pack s
env PRECISIONS=$P WORKLOADS=router REQUESTS=20 HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 \
  bash scripts/h200.sh 0.8B $R/h bench > $R/h/chain.log 2>&1
echo "rc-h $?" >> $R/h/chain.txt; pack h
env PRECISIONS=$P WORKLOADS=router REQUESTS=20 HTTP=1,8,16 HTTP_PROFILE=shared_context \
  bash scripts/h200.sh 0.8B $R/c bench > $R/c/chain.log 2>&1
echo "rc-c $?" >> $R/c/chain.txt; pack c
echo "== $(date -u +%T) chain done"; touch /tmp/chain.done
