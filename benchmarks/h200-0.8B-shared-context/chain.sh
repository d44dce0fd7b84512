#!/usr/bin/env bash
# Detached device chain, 2026-12-02 second session:
#  s  0.8B bf16/graphs/gdn16/mixers: synth, export (now with the packed graph), build, gate, the shared_context
#     check, then in process: router and all-kinds-one-row, exact and :shared_context
#  t  the GPU tests of the capture lock (two instances) and the engine pipeline (tiny bf16 gate)
set -u
source /tmp/stage/env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/chain/fla/*.whl
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
R=/tmp/res; mkdir -p $R/s $R/t
pack() { tar -C $R -czf /tmp/res-$1.tgz.part $1 && mv /tmp/res-$1.tgz.part /tmp/res-$1.tgz; echo "== $(date -u +%T) packed $1"; }
nvidia-smi > $R/s/nvidia-smi.txt 2>&1
P=bf16/graphs/gdn16/mixers
env PRECISIONS=$P bash scripts/h200.sh 0.8B $R/s synth,export,build,validate,shared > $R/s/chain.log 2>&1
echo "rc-s $?" >> $R/s/chain.txt
env PRECISIONS=$P WORKLOADS=router,router:shared_context,all-kinds-one-row,all-kinds-one-row:shared_context REQUESTS=20 \
  bash scripts/h200.sh 0.8B $R/s bench >> $R/s/chain.log 2>&1
echo "rc-b $?" >> $R/s/chain.txt; pack s
env GPU_TESTS="tests/server/test_server_instances.py tests/test_engine_pipeline.py" bash scripts/h200.sh 0.8B $R/t gpu-tests > $R/t/chain.log 2>&1
echo "rc-t $?" >> $R/t/chain.txt; pack t
echo "== $(date -u +%T) chain done"; touch /tmp/chain.done
