#!/bin/sh
# Issue 28's H200 run in three device calls, each inside the 10-minute limit, the machine kept
# warm between them (30 s): phase 1 writes the model and builds llama.cpp side by side, then starts
# the sweep (check.py tune) in its own session so that it outlives the call; phase 2 waits for it
# and starts check.py compare the same way; phase 3 waits for that and brings back
# OUT/<date>-h200-tune.{json,md}. Every wait is on a file: never `pgrep -f` on a pattern, which
# matches the waiting shell's own command line.
#
#   sh tests/gpu/tune.sh 1      # carry: [".gpu"]; about 7 minutes
#   sh tests/gpu/tune.sh 2      # at once after it; about 5 minutes
#   sh tests/gpu/tune.sh 3      # at once after it; up to 9 minutes
#   sh tests/gpu/tune.sh b; sh tests/gpu/tune.sh a   # build and model, then check.py admission
#   sh tests/gpu/tune.sh o      # carry: [".gpu"]; build and model, then the sweep from -ngl 24 (offload)
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
W=/root/rigup-gpu
C=tests/gpu/check.py
OUT=${OUT:-/tmp/rigup-gpu-out}
BUDGET=${BUDGET:-300}
mkdir -p "$W" "$OUT"
case "${1:-}" in
1)
    nvidia-smi --query-gpu=name,memory.total,power.limit --format=csv,noheader
    python3 "$C" model --work "$W" >"$W/model.log" 2>&1 &
    model=$!
    python3 "$C" build --work "$W" >"$W/build.log" 2>&1
    echo "build: exit $?"; tail -n 2 "$W/build.log"
    wait "$model"; echo "model: exit $?"; tail -n 1 "$W/model.log"
    rm -f "$W/tune.done"
    setsid sh -c "python3 $C tune --work $W --out $W --budget $BUDGET >$W/tune.log 2>&1; echo \$? >$W/tune.done" \
        </dev/null >/dev/null 2>&1 &
    sleep 30; cat "$W/tune.log"
    cp "$W/build.log" "$W/model.log" "$OUT/" ;;
2)
    t=0; while [ ! -e "$W/tune.done" ] && [ $t -lt 540 ]; do sleep 3; t=$((t + 3)); done
    echo "tune: exit $(cat "$W/tune.done")"; cat "$W/tune.log"; cp "$W/tune.json" "$W/tune.log" "$OUT/"
    rm -rf "$W/compare" "$W/compare.done"; mkdir -p "$W/compare"
    setsid sh -c "python3 $C compare --work $W --out $W/compare >$W/compare.log 2>&1; echo \$? >$W/compare.done" \
        </dev/null >/dev/null 2>&1 &
    sleep 20; cat "$W/compare.log" ;;
3)
    t=0; while [ ! -e "$W/compare.done" ] && [ $t -lt 560 ]; do sleep 3; t=$((t + 3)); done
    cat "$W/compare.log"; cp -r "$W/compare" "$W/compare.log" "$OUT/"
    [ -e "$W/compare.done" ] && echo "compare: exit $(cat "$W/compare.done")" || echo "compare: still running; run phase 3 again" ;;
b)  # the build and the model alone (for check.py admission), nothing started after
    python3 "$C" model --work "$W" >"$W/model.log" 2>&1 &
    model=$!
    python3 "$C" build --work "$W" >"$W/build.log" 2>&1
    echo "build: exit $?"; tail -n 2 "$W/build.log"
    wait "$model"; echo "model: exit $?"; tail -n 1 "$W/model.log" ;;
a)  # at once after b: the host-RAM prompt cache on and off at 16 and 32 concurrent (about 4 minutes)
    python3 "$C" admission --work "$W" --out "$OUT" ;;
o)  # one call: the build and the model, then the sweep from a partial offload (-ngl 24 of 32 layers)
    python3 "$C" model --work "$W" >"$W/model.log" 2>&1 &
    model=$!
    python3 "$C" build --work "$W" >"$W/build.log" 2>&1
    echo "build: exit $?"; tail -n 1 "$W/build.log"
    wait "$model"; echo "model: exit $?"
    python3 "$C" tune --work "$W" --out "$OUT" --ngl 24 --levels 8 --budget "${BUDGET:-150}"
    cat "$OUT/tune.md" ;;
*)
    echo "usage: sh tests/gpu/tune.sh 1|2|3|b|a|o" >&2; exit 2 ;;
esac
