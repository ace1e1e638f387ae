"""Preflight's refusals, as pure functions of plan, facts and data."""

from roles.gpu.plan import hardware_plan
from roles.preflight import refusals


def test_gpu_roles_on_a_host_without_gpu_are_refused_with_a_fix():
    plan = hardware_plan([], {"version": None, "kernel_module": None, "loaded": False}, [])
    (refusal,) = refusals(plan, {}, {"gpu_enabled": True})
    line = refusal.line("node-7")
    assert line.startswith("[node-7] refused: GPU roles enabled on a host without a usable NVIDIA GPU")
    assert "fix: install the NVIDIA driver, or set gpu_enabled: false" in line


def test_cpu_only_host_with_gpu_roles_off_passes():
    plan = hardware_plan([], {"version": None, "kernel_module": None, "loaded": False}, [])
    assert refusals(plan, {}, {"gpu_enabled": False}) == []
