#!/usr/bin/env bash
# A device chain on the lent H200: one detached script that runs scripts/h200.sh steps for longer than one call
# may last, started, fed its wheels and polled by short calls. Each call runs in a fresh copy of the working
# tree; the machine keeps /tmp between calls while they follow each other, and goes back about 30 s after the
# last one returns, taking the chain with it. So the calls follow each other at once, nothing else between.
#
#   scripts/device.sh start CHAIN [DIR]   the first call (carry DIR/p1 and CHAIN): snapshot this tree into
#                                         /tmp/repo (the chain runs there, untouched by later calls' copies),
#                                         stage part 1 and launch CHAIN detached
#   scripts/device.sh stage K [DIR]       the next calls (carry DIR/pK): stage part K; the call that brings
#                                         the last part installs the wheels into /tmp/site
#   scripts/device.sh poll PATTERN [S]    wait until a line of the chain's log matches PATTERN (grep -E) or S
#                                         seconds pass (default 540), copying each packed result to $OUT as it
#                                         lands; poll for the chain's end in as few calls as fit (a gap between
#                                         two calls, the caller's own time included, may lose the machine)
#
# DIR holds the parts of scripts/device-pack.sh (default .device). A chain sources scripts/device-chain.sh
# for its log, its packing and the wait for the wheels (benchmarks/*/chain.sh are chains that ran).
set -euo pipefail
RESULTS=/tmp/res STAGE=/tmp/stage SITE=/tmp/site REPO=/tmp/repo

stage() {  # stage part $1 of $2
  local part_dir=$2/p$1
  mkdir -p "$STAGE" && cp "$part_dir"/part.* "$STAGE/"
  local parts have
  parts=$(cat "$part_dir/parts") have=$(ls "$STAGE"/part.* | wc -l)
  if [ "$have" -lt "$parts" ]; then echo "staged part $1 of $parts ($have present)"; return; fi
  cat "$STAGE"/part.* | xz -d -T0 | tar -C "$STAGE" -xf -
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$STAGE"/wheels/*.whl
  echo "export PYTHONPATH=$SITE:$REPO\${PYTHONPATH:+:\$PYTHONPATH}" > "$STAGE/env.sh.part" && mv "$STAGE/env.sh.part" "$STAGE/env.sh"
  echo "installed: $(ls "$STAGE"/wheels | tr '\n' ' ')"
}

case ${1:?start, stage or poll} in
  start)
    chain=${2:?the chain script} dir=${3:-.device}
    mkdir -p "$REPO" "$RESULTS"
    tar --exclude=./.device -cf - . | tar -C "$REPO" -xf -
    cp "$chain" "$RESULTS/chain.sh"
    stage 1 "$dir"
    (cd "$REPO" && setsid nohup bash "$RESULTS/chain.sh" > "$RESULTS/chain.out" 2>&1 < /dev/null &)
    echo "chain started in $REPO"
    ;;
  stage)
    stage "${2:?part number}" "${3:-.device}"
    ;;
  poll)
    pattern=${2:?a pattern of the chain log} seconds=${3:-540}
    deadline=$((SECONDS + seconds))
    # Each pack goes to $OUT as soon as it is made: a call cut short (its time limit, the session's device time)
    # still brings back what was packed before.
    until grep -qE "$pattern" "$RESULTS/chain.txt" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; do
      if [ -n "${OUT:-}" ]; then cp -u /tmp/res-*.tgz "$OUT/" 2>/dev/null || true; fi
      sleep 5
    done
    cat "$RESULTS/chain.txt" 2>/dev/null || true
    if [ -n "${OUT:-}" ]; then cp -u /tmp/res-*.tgz "$OUT/" 2>/dev/null || true; fi
    ;;
  *)
    echo "usage: scripts/device.sh start CHAIN [DIR] | stage K [DIR] | poll PATTERN [SECONDS]" >&2
    exit 2
    ;;
esac
