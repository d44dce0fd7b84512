#!/usr/bin/env bash
# Run by hand in the two calls after chain.sh finished (the same machine: the chain's packages, exports and
# engines in /tmp/w and /dev/shm/w), 2026-12-04 18:02-18:06.
source /tmp/stage/env.sh
# 1. The rewrite's GPU tests again (gpu-tests.log), the CUDA EP's CPU fallback allowed for the shape nodes ONNX
#    Runtime always puts on the CPU (the first version refused them: gpu-tests-first.log).
export PYTHONPATH=$PWD:$PYTHONPATH S1OMNI_HOME=/tmp/gh
python3 -m pytest -m gpu tests/test_bf16_convolutions.py -q -p no:cacheprovider -p no:logging -rs | tee "$OUT/gpu-tests-conv16.log"
# 2. The 4B with the short convolutions in bfloat16 and without merged projections, validated, then the router
#    request on it, the chain's two 4B engines and both references in one run (4B/rerun/).
export PYTHONPATH=/tmp/repo:$PYTHONPATH S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w S1OMNI_ORT_INCLUDE=/tmp/ort-include
cd /tmp/repo
K=ChunkedGatedDeltaRule
env KERNELS=$K PRECISIONS=bf16/graphs/gdn16/mixers/conv16/attn16 bash scripts/h200.sh 4B "$OUT/a4" build,validate
env KERNELS=$K PRECISIONS=bf16/graphs/gdn16/mixers/conv16/attn16,bf16/graphs/gdn16/mixers/attn16,bf16/graphs/gdn16/merged/mixers/conv16/attn16 \
  WORKLOADS=router REQUESTS=8 PROFILE= bash scripts/h200.sh 4B "$OUT/a4" bench
