#!/bin/sh
# rigup's read-only plays through pyinfra itself (@local connector) on a real NVIDIA machine with
# no network: preflight.py (with gpu_power's plan: each card's limits and what would change), which has no operation
# that changes anything; never deploy.py, not even with --dry, on a machine we may only read.
# Needs the pinned wheels in .gpu/wheels (pip download -r requirements.txt for the machine's Python).
# Only reads GPU settings: checks that power limits, persistence mode and the application clocks
# are the same before and after.      sh tests/gpu/pyinfra_plan.sh   (from the repository root)
set -u
cd "$(dirname "$0")/../.."
venv=${RIGUP_GPU_VENV:-/root/rigup-venv}
[ -x "$venv/bin/pyinfra" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q --no-index \
    --find-links .gpu/wheels -r requirements.txt; } || exit 1
q="nvidia-smi --query-gpu=uuid,power.limit,persistence_mode,clocks.applications.graphics --format=csv,noheader"
before=$($q)
min=$(nvidia-smi --query-gpu=power.min_limit --format=csv,noheader,nounits | head -n 1 | cut -d. -f1)
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)
run() { echo "== pyinfra @local $*"; "$venv/bin/pyinfra" -y @local "$@" 2>&1; echo "== exit $?"; }
run preflight.py
run preflight.py --data gpu_power_watts="$min" --data "gpu_power_overrides={\"$uuid\": $((min + 50))}"
run preflight.py --data gpu_power_watts=1000
run preflight.py --data gpu_power_watts="$min"
after=$($q)
if [ "$before" = "$after" ]; then echo "OK: nothing changed ($after)"; else
    printf 'FAIL: the cards changed\nbefore: %s\nafter:  %s\n' "$before" "$after"; exit 1; fi
