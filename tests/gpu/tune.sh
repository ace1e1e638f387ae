#!/bin/sh
# Issue 28's H200 run in two device calls, each well inside the 10-minute limit, the machine kept
# warm between them (30 s): phase 1 writes the model and builds llama.cpp side by side, then starts
# the sweep (check.py tune) in its own session so that it outlives the call; phase 2 waits for it
# and runs check.py compare, which writes OUT/<date>-h200-tune.{json,md}. Every wait is on a PID or
# a file: never `pgrep -f` on a pattern, which matches the waiting shell's own command line.
#
#   sh tests/gpu/tune.sh 1      # carry: [".gpu"]; about 7 minutes
#   sh tests/gpu/tune.sh 2      # at once after it; about 8 minutes
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
W=/root/rigup-gpu
C=tests/gpu/check.py
OUT=${OUT:-/tmp/rigup-gpu-out}
BUDGET=${BUDGET:-240}
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
    while [ ! -e "$W/tune.done" ]; do sleep 3; done
    echo "tune: exit $(cat "$W/tune.done")"; cat "$W/tune.log"; cp "$W/tune.json" "$W/tune.log" "$OUT/"
    python3 "$C" compare --work "$W" --out "$OUT" ;;
*)
    echo "usage: sh tests/gpu/tune.sh 1|2" >&2; exit 2 ;;
esac
