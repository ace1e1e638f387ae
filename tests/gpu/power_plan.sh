#!/bin/sh
# gpu_power's plan mode on a real NVIDIA machine (python3 and nvidia-smi only; no pyinfra, no
# network). Reads only: prints the card(s), their limits, and what each example policy would
# change; checks that the power limits and persistence mode are the same before and after.
#   sh tests/gpu/power_plan.sh            (from the repository root)
set -eu
cd "$(dirname "$0")/../.."
q="nvidia-smi --query-gpu=uuid,power.limit,persistence_mode --format=csv,noheader"
before=$($q)
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)
min=$(nvidia-smi --query-gpu=power.min_limit --format=csv,noheader,nounits | head -n 1 | cut -d. -f1)
echo "== the policy of a host that leaves limits alone (gpu_power_watts: null)"
python3 tests/gpu/power_plan.py
echo "== gpu_power_watts: $min (the card's minimum), and an override of the first card by UUID"
python3 tests/gpu/power_plan.py --watts "$min" --override "$uuid=$((min + 50))"
echo "== out of range (5000 W): refused"
python3 tests/gpu/power_plan.py --watts 5000 && { echo "FAIL: 5000 W was not refused"; exit 1; } || true
after=$($q)
if [ "$before" = "$after" ]; then echo "OK: nothing changed ($after)"; else
    printf 'FAIL: the cards changed\nbefore: %s\nafter:  %s\n' "$before" "$after"; exit 1; fi
