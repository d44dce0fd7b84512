#!/usr/bin/env bash
# Device chain (issue 17), run on 2026-12-07 on an NVIDIA H100 80GB HBM3 (chain.txt; t in gpu-tests/, h in
# 0.8B-http-batching/, k in 4B-http-batching/; benchmarks/README.md, h100-forward-alone). It measured the capture
# policy of e524f7b (a worker that met a graph it could not capture holds its next forward alone,
# CAPTURE_LOCK.forward()) and one copy of the weights a process (runtime/runners/device_weights.py) on the runs
# h100-capture-policy made: there the 0.8B with captures that never waited answered 7.81 / 13.28 req/s at 8 / 16
# clients (h100-host-gil, captures waiting per graph: 38.64 / 40.35), and the 4B ran the 80 GB card out of memory at
# 8 clients with six copies of its weights. About 20 minutes with the plain pack (h100-capture-policy took 16:26-16:46).
#  t  the GPU tests: two instances of a CUDA-graph engine answering merged batches at 16 clients, graphs captured
#     (tests/server/test_server_instances.py), and the shared copy read in place (tests/test_device_weights.py)
#  h  the 0.8B (h100-host-gil's build) built, validated, served with `batching` and two instances at 1, 8 and 16
#     clients, the reference server last; `server_cpu.cuda_graphs` gives each level's captures and deferred runs
#  k  the 4B (.../heads/gates/onorms/silu/rotary/attn16) synthesized, exported and built while the 0.8B validates,
#     validated, served as h without the reference server (about 1.5 of its router requests a second)
# The arms are h100-capture-policy/chain.sh's, run again with t's test files changed.
# Run with scripts/device.sh: start CHAIN (carry DIR/p1), stage 2..N (the last with .device/ort-include copied to
# /tmp/ort-include), poll "chain done"; DIR: parts small enough to travel beside the tree (64 MiB a call), e.g.
# PART_BYTES=28M scripts/device-pack.sh. Rename the folder after the card.
GPU_TESTS="tests/server/test_server_instances.py tests/test_device_weights.py" exec bash benchmarks/h100-capture-policy/chain.sh
