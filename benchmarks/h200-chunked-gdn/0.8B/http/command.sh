#!/usr/bin/env bash
# Run by hand in the call after chain.sh finished (the same machine: the chain's package and engine in /tmp/w
# and /dev/shm/w), 2026-12-04 14:29: the ChunkedGatedDeltaRule engine over HTTP, exact profile, 20 requests a
# client after 2 warm-ups, beside the torch reference's server.
source /tmp/stage/env.sh
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w
env KERNELS=ChunkedGatedDeltaRule PRECISIONS=bf16/graphs/gdn16/mixers/attn16 WORKLOADS=router REQUESTS=20 WARMUP=2 PROFILE= \
  HTTP=1,8,16 bash scripts/h200.sh 0.8B "$OUT/h" bench
