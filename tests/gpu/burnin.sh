#!/bin/sh
# rigup-burnin on a real NVIDIA machine (python3, nvidia-smi and the driver's libcuda.so.1 only; no
# pyinfra, no toolkit, no network): the quick level (its time printed: goal at most 30 s), then the
# standard level with a 2-minute soak at the cap in force, on every card. Reads GPU settings only:
# power limit, persistence, ECC, compute mode and application clocks must be the same before and
# after. Results: $OUT (or the first argument, else /tmp/rigup-burnin).
#   sh tests/gpu/burnin.sh [OUT]
set -eu
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/rigup-burnin}}
mkdir -p "$out"
q="nvidia-smi --query-gpu=index,uuid,power.limit,persistence_mode,ecc.mode.current,compute_mode,clocks.applications.graphics,clocks.applications.memory --format=csv,noheader"
before=$($q)
nvidia-smi -q > "$out/nvidia-smi-q-before.txt"
run() {
    level=$1; shift
    t0=$(date +%s.%N)
    rc=0
    python3 roles/burnin/acceptance.py run --level "$level" --results "$out/records.json" --metrics "$out/burnin.prom" \
        --json "$out/$level.json" --testing "$out/testing.json" "$@" || rc=$?
    t1=$(date +%s.%N)
    echo "== $level level: exit $rc, $(python3 -c "print(round($t1 - $t0, 1))") s" | tee -a "$out/times.txt"
}
run quick
run standard --soak-s 120
after=$($q)
if [ "$before" = "$after" ]; then echo "OK: GPU settings unchanged ($after)" | tee -a "$out/times.txt"; else
    printf 'FAIL: GPU settings changed\nbefore: %s\nafter:  %s\n' "$before" "$after" | tee -a "$out/times.txt"; exit 1; fi
