#!/usr/bin/env bash
# Run on the same machine right after the chain (benchmarks/h200-omnijev-4B-vgraphs/chain.sh, step n), in one
# device call, on the package and engine that chain left in /tmp/w and /dev/shm/w:
source /tmp/stage/env.sh
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
env PRECISIONS=bf16/graphs/gdn16/mixers/attn16 WORKLOADS=backbone REQUESTS=8 PROFILE=backbone-128 bash scripts/h200.sh 9B "$OUT/m" bench
