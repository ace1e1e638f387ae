#!/bin/sh
# rigup-burnin on a real NVIDIA machine (python3, nvidia-smi, the driver's libcuda.so.1 and the
# host's cuBLAS where it has one; no pyinfra, no network): the quick level (its time printed: goal
# at most 30 s), then the standard level with a 2-minute soak at the cap in force (GEMM on random
# operands through cuBLAS, every card at once; goal: a mean draw of at least 0.95 of the cap, every
# digest equal, at most 5 minutes), its power samples kept. With BURNIN_PTX=S, also S seconds of the
# load used where a host has no cuBLAS (--load ptx), to say what it reaches. Reads GPU settings
# only: power limits, persistence, ECC, compute mode and application clocks must be the same before
# and after (nvidia-smi --query-gpu and the settings lines of nvidia-smi -q).
# BURNIN_LEVELS="quick" runs only that level; BURNIN_PULSE=S adds S seconds of the pulse (every
# card's load switched on and off 4 times a second; its record and draw samples kept).
# Results: $OUT (or the first argument, else /tmp/rigup-burnin), at most 10 files.
#   sh tests/gpu/burnin.sh [OUT]
set -eu
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-/tmp/rigup-burnin}}
work=$(mktemp -d)
mkdir -p "$out"
settings() {
    nvidia-smi --query-gpu=index,uuid,power.limit,enforced.power.limit,persistence_mode,ecc.mode.current,ecc.mode.pending,compute_mode,clocks.applications.graphics,clocks.applications.memory,clocks.default_applications.graphics --format=csv,noheader
    nvidia-smi -q | grep -E '^\s*(Persistence Mode|Current Power Limit|Requested Power Limit|Enforced Power Limit|Default Power Limit|Compute Mode|Auto Boost|Auto Boost Default)\s*:' || true
    nvidia-smi -q | grep -E -A2 '^\s*(ECC Mode|Applications Clocks|Default Applications Clocks)\s*$' || true
}
before=$(settings)
echo "$before" > "$out/settings.txt"
run() {
    name=$1 level=$2; shift 2
    t0=$(date +%s.%N)
    rc=0
    python3 roles/burnin/shipped/acceptance.py run --level "$level" --results "$work/records.json" --metrics "$work/burnin.prom" \
        --json "$out/$name.json" --testing "$work/testing.json" "$@" || rc=$?
    t1=$(date +%s.%N)
    echo "== $name ($level level): exit $rc, $(python3 -c "print(round($t1 - $t0, 1))") s" | tee -a "$out/times.txt"
}
for level in ${BURNIN_LEVELS:-quick standard}; do
    case $level in
        quick) run quick quick ;;
        standard) run standard standard --soak-s 120 --samples "$out/standard-samples.json" ;;
    esac
done
if [ -n "${BURNIN_PULSE:-}" ]; then   # the pulse of the host's power delivery: every card at once, 4 Hz
    t0=$(date +%s.%N)
    rc=0
    python3 roles/burnin/shipped/acceptance.py pulse --seconds "$BURNIN_PULSE" --hz 4 --results "$work/records.json" \
        --pulse-results "$out/pulse.json" --metrics "$work/burnin.prom" --testing "$work/testing.json" \
        --samples "$out/pulse-samples.json" || rc=$?
    t1=$(date +%s.%N)
    echo "== pulse ($BURNIN_PULSE s at 4 Hz): exit $rc, $(python3 -c "print(round($t1 - $t0, 1))") s" | tee -a "$out/times.txt"
fi
if [ -n "${BURNIN_PTX:-}" ]; then
    run ptx quick --soak-s "$BURNIN_PTX" --load ptx --samples "$out/ptx-samples.json"
fi
after=$(settings)
printf '\n-- after --\n%s\n' "$after" >> "$out/settings.txt"
if [ "$before" = "$after" ]; then echo "OK: GPU settings unchanged" | tee -a "$out/times.txt"; else
    echo "FAIL: GPU settings changed (settings.txt)" | tee -a "$out/times.txt"; exit 1; fi
