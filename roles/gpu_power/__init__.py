"""roles/gpu_power: per-card power limits, applied by a boot unit and verified live.

Implemented by issue 7; preflight reads its variables (roles/gpu_power/defaults.yml):
gpu_power_watts, gpu_power_overrides.
"""
