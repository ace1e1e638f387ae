"""roles/cmpunlocker: build and install cmpunlocker's patched open NVIDIA kernel modules.

Implemented by issue 7; preflight reads its variables (roles/cmpunlocker/defaults.yml):
cmpunlocker_enabled, cmpunlocker_profile, cmpunlocker_supported_drivers.
"""
