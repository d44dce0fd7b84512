#!/usr/bin/env bash
# One device call, 2026-12-03 third session, on the machine the OmniJev chain (h200-omnijev-4B-head/) had just
# finished on (its /tmp/repo snapshot and /tmp/stage wheels): the 4B synthetic member, the 0.8B attn16 record's
# engine options (bf16/graphs/gdn16/mixers/attn16), validated at gpu-reduced, then the router request in process
# against both references. The call's $OUT returns at most eight files, so the validation's .txt/.json did not
# come back: validate-tail.log is the chain log's tail, and bench.json's engine "validated": true is the gate's
# verdict (bench times only engines that passed; settings.allow_unvalidated false).
set -u
cd /tmp/repo && source /tmp/stage/env.sh && rm -rf /dev/shm/w
export S1OMNI_WORK=/tmp/w4 S1OMNI_SCRATCH=/dev/shm/w4 PYTHONUNBUFFERED=1
V=bf16/graphs/gdn16/mixers/attn16
mkdir -p $OUT/a
env PRECISIONS=$V bash scripts/h200.sh 4B $OUT/a synth,export,build,validate > $OUT/a/chain-validate.log 2>&1
echo "rc-validate $?" >> $OUT/a/chain.txt
env PRECISIONS=$V WORKLOADS=router REQUESTS=12 PROFILE= bash scripts/h200.sh 4B $OUT/a bench > $OUT/a/chain-bench.log 2>&1
echo "rc-bench $?" >> $OUT/a/chain.txt
