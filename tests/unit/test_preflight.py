"""Preflight: the plan and refusals of whole hosts (every role's checks, as the play hands them
over), its own refusals (no GPU, ports), and the commented recipes of group_vars."""

import pytest

from pathlib import Path
from rigup.gpu.plan import hardware_plan
from roles.preflight.facts import parse_path_bytes
from roles.preflight.facts import path_bytes_command
from roles import in_order
from tests.unit.hosts import host, data, glm_llama, only, refusals, NO_DRIVER


@pytest.mark.parametrize("profile", ["a100", "h100", "cmp170hx"])
def test_defaults_on_each_profile_pass(profile):
    plan, facts = host(profile)
    assert refusals(plan, facts, data()) == []


def test_seed_recipe_glm_q4_on_4x_h100_passes():
    plan, facts = host("h100")
    recipe = glm_llama(ctx=65536, parallel=8, ngl=99, flash_attn="on", jinja=True)
    assert refusals(plan, facts, data(**recipe)) == []


def test_every_line_names_host_what_why_and_fix():
    plan, facts = host("a100")
    (r,) = only(refusals(plan, facts, data(gpu_power_watts=450)), "power_range")
    line = r.line("node-7")
    assert line.startswith("[node-7] refused: gpu_power_watts 450 W is outside")
    assert "; fix: " in line and "\n" not in line


def test_3_gpu_roles_on_a_host_without_gpu_are_refused_with_a_fix():
    plan = hardware_plan([], NO_DRIVER, [])
    (refusal,) = refusals(plan, {}, data(gpu_enabled=True))
    line = refusal.line("node-7")
    assert line.startswith("[node-7] refused: GPU roles enabled on a host without a usable NVIDIA GPU")
    assert "fix: install the NVIDIA driver, or set gpu_enabled: false" in line


def test_3_cpu_only_host_with_gpu_roles_off_passes():
    plan = hardware_plan([], NO_DRIVER, [])
    assert refusals(plan, {}, data(gpu_enabled=False)) == []


def test_3_a_gpu_less_host_gets_only_that_refusal_not_every_gpu_check():
    plan = hardware_plan([], NO_DRIVER, [])
    found = refusals(plan, {}, data(gpu_power_watts=900, cuda_version="10.2", cmpunlocker_enabled=True))
    assert [r.check for r in found] == ["gpu_host"]


def test_6_port_taken_by_another_process_names_it():
    plan, facts = host("h100", listening_ports={22: "sshd", 8080: "python3"})
    found = refusals(plan, facts, data(**glm_llama(port=8080)))
    (r,) = only(found, "ports")
    assert r.what == "port 8080 of llama_server_instances.glm is already taken"
    assert "process python3 listens on it" in r.why
    assert "stop python3 or give the instance another port (llama_server_instances.glm.port: 8081 is free)" in r.fix


def test_6_port_held_by_our_own_server_is_not_refused():
    plan, facts = host("h100", listening_ports={22: "sshd", 8081: "llama-server"})
    assert refusals(plan, facts, data(**glm_llama(port=8081))) == []


def test_6_ports_that_cannot_be_read_are_refused_not_passed():
    plan, facts = host("h100", listening_ports=None)
    found = only(refusals(plan, facts, data(**glm_llama())), "ports")
    assert [r.what for r in found] == ["cannot tell whether port 8081 is free (llama_server_instances.glm)",
                                       "cannot tell whether port 9100 is free (metrics_node_exporter_port)",
                                       "cannot tell whether port 9101 is free (metrics_relay_port)"]


def test_6_port_held_by_an_unnamed_process():
    plan, facts = host("h100", listening_ports={8081: None})
    (r,) = only(refusals(plan, facts, data(**glm_llama())), "ports")
    assert "a process that cannot be named here" in r.why


def test_6_two_instances_on_one_port():
    plan, facts = host("h100")
    d = glm_llama()
    d["vllm_instances"] = {"glm": {"model": "glm", "port": 8081, "tp": 4}}
    found = [r for r in refusals(plan, facts, data(**d)) if r.check == "ports"]
    assert found[0].what == "port 8081 is given to 2 instances"
    assert "llama_server_instances.glm and vllm_instances.glm" in found[0].why


def test_7_path_bytes_fact_parsing():
    assert "du -sbD '/srv/models/a b'" in path_bytes_command(["/srv/models/a b"])
    lines = ["##rigup-bytes:/srv/models/glm", "199715979264", "##rigup-bytes:/srv/models/ds"]
    assert parse_path_bytes(lines) == {"/srv/models/glm": 199715979264, "/srv/models/ds": 0}


def test_each_role_declares_its_checks_and_they_are_pure():
    counts = {role.name: len(role.checks) for role in in_order()}
    assert counts == {"base": 1, "nvidia_driver": 8, "cuda_toolkit": 3, "llama_cpp": 1, "model_fetch": 5, "gpu_power": 6,
                      "gpu_guard": 2, "cmpunlocker": 6, "llama_server": 8, "vllm": 10, "balancer": 2,
                      "metrics": 2, "watchdog": 0, "rpc_worker": 0, "burnin": 4}
    assert [r.name for r in in_order() if r.ports] == ["model_fetch", "rpc_worker", "llama_server", "vllm",
                                                                                   "balancer", "metrics"]
    plan, facts = host("a100")
    before = repr((plan, facts))
    refusals(plan, facts, data(**glm_llama(split_mode="row"), gpu_power_watts=900, cmpunlocker_enabled=True))
    assert repr((plan, facts)) == before


def commented_example(group: str) -> dict:
    """The commented-out recipe at the end of group_vars/<group>.yml, as data."""
    import re

    import yaml
    text = (Path(__file__).resolve().parents[2] / "group_vars" / f"{group}.yml").read_text()
    lines = [ln[2:] for ln in text.splitlines()
             if re.match(r"# ([a-z_]+:|  )", ln) and not ln[2:].lstrip().startswith("(")]
    return yaml.safe_load("\n".join(lines))


@pytest.mark.parametrize("group", ["a100", "h100", "cmp170hx"])
def test_group_vars_examples_are_valid_and_pass_on_their_cards(group):
    example = commented_example(group)
    assert example.get("models"), example
    from rigup.config import problems
    assert problems(example) == []
    plan, facts = host(group)
    # the CMP recipe's patch series is the operator's own files (vllm_patch_manifest): not in this repo
    assert [r for r in refusals(plan, facts, data(**example)) if r.check != "vllm_pin"] == []


def test_what_needs_systemd_is_refused_where_it_is_not_pid_1():
    plan, facts = host("a100", systemd=False)
    assert refusals(plan, facts, data()) == []          # downloads and the build need no systemd
    found = only(refusals(plan, facts, data(gpu_power_watts=300, **glm_llama())), "systemd")
    assert sorted(r.what for r in found) == ["gpu_power_watts on a host without systemd",
                                             "llama_server_instances (glm) on a host without systemd"]
    assert "systemd is not PID 1 here" in found[0].why and "model downloads" in found[0].fix
    plan, facts = host("a100")
    assert refusals(plan, facts, data(gpu_power_watts=300, **glm_llama())) == []
