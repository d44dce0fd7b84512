#!/usr/bin/env bash
# Detached device chain, 2026-12-02 fourth session (the third's HTTP steps were lost with its machine):
#  g  0.8B bf16/graphs/gdn16/mixers: synth, export, build, validate (gpu-reduced), shared (gpu-reduced-alone; c serves it)
#  h  over HTTP, 1/8/16 clients, 20 requests each after warm-up: batching, --instances 2 (share cap on the GPU)
#  c  over HTTP, 1/8/16 clients: shared_context, --instances 2 (packed calls now CUDA graphs)
#  e  over HTTP, 1/8/16 clients: exact, --instances 3
set -u
source /tmp/stage/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/chain/fla/*.whl
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
R=/tmp/res; mkdir -p $R/g $R/h $R/c $R/e
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; echo "== $(date -u +%T) packed $1"; }
nvidia-smi > $R/g/nvidia-smi.txt 2>&1
P=bf16/graphs/gdn16/mixers
cp .device/chain/run.sh $R/g/chain.sh
env PRECISIONS=$P bash scripts/h200.sh 0.8B $R/g synth,export,build,validate,shared > $R/g/chain.log 2>&1
echo "rc-g $?" >> $R/g/chain.txt; pack g
env PRECISIONS=$P WORKLOADS=router REQUESTS=20 HTTP=1,8,16 HTTP_PROFILE=batching SERVE_ARGS=--instances=2 \
  bash scripts/h200.sh 0.8B $R/h bench > $R/h/chain.log 2>&1
echo "rc-h $?" >> $R/h/chain.txt; pack h
env PRECISIONS=$P WORKLOADS=router:shared_context REQUESTS=20 HTTP=1,8,16 HTTP_PROFILE=shared_context SERVE_ARGS=--instances=2 \
  bash scripts/h200.sh 0.8B $R/c bench > $R/c/chain.log 2>&1
echo "rc-c $?" >> $R/c/chain.txt; pack c
env PRECISIONS=$P WORKLOADS=router REQUESTS=20 HTTP=1,8,16 HTTP_PROFILE=exact SERVE_ARGS=--instances=3 \
  bash scripts/h200.sh 0.8B $R/e bench > $R/e/chain.log 2>&1
echo "rc-e $?" >> $R/e/chain.txt; pack e
echo "== $(date -u +%T) chain done"; touch /tmp/chain.done
