# Sourced by a device chain (`scripts/device.sh start CHAIN` runs CHAIN detached from /tmp/repo, a snapshot of
# the tree): results under $R, a log line per step in $R/chain.txt (what `scripts/device.sh poll` reads), each
# finished result directory packed to /tmp/res-NAME.tgz (what it copies to $OUT), and the wait for the wheels
# the later calls bring. For example:
#
#   source scripts/device-chain.sh
#   mkdir -p $R/a; bash scripts/h200.sh 0.8B $R/a synth > $R/a/synth.log 2>&1; log "rc-a-synth $?"  # no wheel needed
#   wait_for_wheels
#   env PRECISIONS=bf16/graphs bash scripts/h200.sh 0.8B $R/a export,build,validate > $R/a/build.log 2>&1
#   log "rc-a-validate $?"; pack a
#   log "chain done"
#
# and from here: `scripts/device.sh start CHAIN`, then `stage 2` .. `stage N`, then `poll "chain done"`.
R=/tmp/res
export S1OMNI_WORK=/tmp/w S1OMNI_SCRATCH=/dev/shm/w PYTHONUNBUFFERED=1
mkdir -p "$R"

log() { echo "== $(date -u +%T) $*" >> "$R/chain.txt"; }

pack() {  # pack $R/$1 for the next poll
  tar -C "$R" -czf "/tmp/res-$1.tgz.part" "$1" && mv "/tmp/res-$1.tgz.part" "/tmp/res-$1.tgz"
  log "packed $1"
}

wait_for_wheels() {  # until the call that brings the last part has installed them
  while [ ! -f /tmp/stage/env.sh ]; do sleep 1; done
  source /tmp/stage/env.sh
  log "wheels staged: $(python3 -c 'import onnxruntime; print("onnxruntime", onnxruntime.__version__)' 2>&1)"
}

passed() {  # whether the validation report $1 passed its gate
  python3 -c "import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))['passed'] else 1)" "$1" 2>/dev/null
}

nvidia-smi > "$R/nvidia-smi.txt" 2>&1 || true
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$R/pip.log" 2>&1
log "this tree installed: rc $?"
