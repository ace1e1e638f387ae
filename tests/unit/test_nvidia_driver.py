"""roles/nvidia_driver and rigup/gpu/driver.py: the driver step planned from the PCI bus, the
packages, the refusals, and the CUDA checks held to the branch the host will have."""

from rigup.gpu.driver import driver_for_checks, modules_choice, planned_gpus
from rigup.gpu.facts import parse_gpus, parse_pci
from rigup.gpu.plan import hardware_plan
from roles.cuda_toolkit.checks import check_driver_for_cuda
from roles.nvidia_driver.checks import (check_cards, check_distribution, check_headers, check_modules,
                                        check_secure_boot, check_serving)
from roles.nvidia_driver.facts import parse_driver_host
from roles.nvidia_driver.packages import at_branch, driver_packages
from roles.vllm.checks import check_wheel_cuda
from tests.unit.hosts import FIX, NO_DRIVER, data, host, refusals

# what PCI_COMMAND prints on an 8 x A100 SXM4 80GB host: each card, and one audio function of a
# consumer card that must not count (class 0x0403)
A100_PCI = [f"0000:{bus}:00.0 0x20b2 0x030200" for bus in ("07", "0f", "47", "4e", "87", "90", "b7", "bd")]
DEBIAN = {"os": {"id": "debian", "version_id": "12", "version_codename": "bookworm"}, "packages": {},
          "modules": [], "headers_candidate": None, "release": "6.1.0-28-amd64", "headers": True}


def bare(pci=A100_PCI, host_state=DEBIAN, **extra) -> dict:
    """The facts of a host with NVIDIA cards on its PCI bus and no driver."""
    return {"gpus": [], "driver": dict(NO_DRIVER), "cuda_toolkits": [], "listening_ports": {22: "sshd"},
            "secure_boot": None, "kernel": {"release": "6.1.0-28-amd64", "headers": True}, "systemd": True,
            "free_disk": {"/": 500 * 1024 ** 3}, "model_bytes": {}, "serving_units": [],
            "pci": parse_pci(pci), "reads": {"DriverHost": host_state}, **extra}


def plan_of(facts: dict, d: dict) -> dict:
    """The plan as preflight makes it (roles/preflight run)."""
    gpus, step = planned_gpus(facts, d)
    return dict(hardware_plan(gpus, facts["driver"], []), systemd=True,
                serving_units=facts.get("serving_units", []), driver_step=step)


def test_pci_lists_the_nvidia_gpus_in_bus_order_not_their_audio_functions():
    found = parse_pci(["0000:b7:00.0 0x20b2 0x030200", "0000:07:00.0 0x2330 0x030000",
                       "0000:07:00.1 0x22bc 0x040300", "garbage", ""])
    assert found == [{"bus_id": "0000:07:00.0", "pci_device_id": "10de:2330"},
                     {"bus_id": "0000:b7:00.0", "pci_device_id": "10de:20b2"}]


def test_a_bare_host_is_planned_from_its_pci_bus_as_nvidia_smi_will_report_it():
    d = data(nvidia_driver_branch=580)
    plan = plan_of(bare(), d)
    step = plan["driver_step"]
    assert step["predicted"] and step["branch"] == 580 and step["loaded"] is None and step["unknown"] == []
    assert not plan["cpu_only"] and plan["gpu_count"] == 8 and plan["cuda_archs"] == ["80"]
    assert plan["vram_mib"]["per_card"] == [81920] * 8
    # the same cards, by bus id, as the real nvidia-smi capture of such a host
    smi = hardware_plan(parse_gpus((FIX / "a100-query-nounits.csv").read_text().splitlines()), {}, [])
    assert [c["bus_id"] for c in plan["cards"]] == sorted(c["bus_id"] for c in smi["cards"])
    assert [c["class"] for c in plan["cards"]] == [c["class"] for c in smi["cards"]]
    assert refusals(plan, bare(), d) == []
    # without a branch, the same host is refused as before: no driver answers
    plain = plan_of(bare(), data())
    assert plain["cpu_only"] and plain["driver_step"] is None
    assert [r.check for r in refusals(plain, bare(), data())] == ["gpu_host"]


def test_a_locked_cmp_is_planned_locked():
    plan = plan_of(bare(pci=["0000:01:00.0 0x20c2 0x030200"]), data(nvidia_driver_branch=580))
    assert plan["needs_unlock"] and plan["vram_mib"]["per_card"] == [8192]
    assert plan["vram_unlocked_mib"]["per_card"] == [65536]


def test_no_step_when_the_branch_answers_and_a_step_for_another_branch():
    plan, facts = host("a100")     # driver 580.x loaded
    facts["reads"] = {"DriverHost": DEBIAN}
    assert plan_of(facts, data(nvidia_driver_branch=580))["driver_step"] is None
    step = plan_of(facts, data(nvidia_driver_branch=535))["driver_step"]
    assert step["loaded"].startswith("580.") and not step["predicted"] and step["branch"] == 535
    assert plan_of(facts, data(nvidia_driver_branch=535, gpu_enabled=False))["driver_step"] is None


def test_unknown_cards_and_hosts_without_a_card_are_refused():
    d = data(nvidia_driver_branch=580)
    facts = bare(pci=["0000:01:00.0 0xffff 0x030200"])
    [r] = check_cards(plan_of(facts, d), facts, d)
    assert "0000:01:00.0 (10de:ffff)" in r.what and "catalogue" in r.fix
    facts = bare(pci=[])
    [r] = check_cards(plan_of(facts, d), facts, d)
    assert r.check == "driver_cards" and "without an NVIDIA GPU" in r.what


def test_modules_by_compute_capability():
    d = data(nvidia_driver_branch=580)
    plan = plan_of(bare(), d)
    assert modules_choice(plan, "auto") == ("open", "")
    assert modules_choice(plan, "proprietary") == ("proprietary", "")
    pascal = {"cards": [{"compute_capability": [6, 1]}]}
    assert modules_choice(pascal, "auto") == ("proprietary", "")
    assert modules_choice(pascal, "open")[0] is None
    blackwell = {"cards": [{"compute_capability": [10, 0]}]}
    assert modules_choice(blackwell, "auto") == ("open", "")
    chosen, why = modules_choice(blackwell, "proprietary")
    assert chosen is None and "they run: open" in why
    # a host of both: no flavour runs every card
    assert modules_choice({"cards": [*pascal["cards"], *blackwell["cards"]]}, "auto")[0] is None
    [r] = check_modules(pascal | {"cpu_only": False}, {}, data(nvidia_driver_branch=580, nvidia_driver_modules="open"))
    assert r.check == "driver_modules"


def test_packages_by_distribution_and_branch():
    deb = driver_packages("debian", 535, "open")
    assert deb["packages"] == ["nvidia-open-kernel-dkms", "firmware-nvidia-gsp", "nvidia-smi", "libcuda1",
                               "nvidia-persistenced"]
    assert deb["versioned"] and deb["components"] == ["contrib", "non-free", "non-free-firmware"]
    assert driver_packages("debian", 535, "proprietary")["packages"][0] == "nvidia-kernel-dkms"
    ubu = driver_packages("ubuntu", 580, "open")
    assert ubu["packages"] == ["nvidia-headless-580-server-open", "nvidia-utils-580-server"] and not ubu["versioned"]
    assert driver_packages("fedora", 580, "open") is None
    installed = {"nvidia-smi": {"version": "535.261.03-1", "held": True},
                 "libcuda1": {"version": "530.30.02-1", "held": False}}
    assert at_branch(installed, ["nvidia-smi", "libcuda1", "nvidia-persistenced"], 535, True) == \
        ["libcuda1", "nvidia-persistenced"]


def test_driver_host_fact():
    lines = ["##rigup-driver:os", "ID=debian", 'VERSION_ID="12"', "VERSION_CODENAME=bookworm",
             "##rigup-driver:packages", "nvidia-smi 535.261.03-1 hi ", "libcuda1 535.261.03-1 ii ",
             "nvidia-kernel-dkms 535.261.03-1 rc ",    # removed, its configuration left: not installed
             "##rigup-driver:modules", "nouveau", "##rigup-driver:headers", "(none)",
             "##rigup-driver:kernel", "6.18.44-fc", "headers=no"]
    state = parse_driver_host(lines)
    assert state["os"] == {"id": "debian", "version_id": "12", "version_codename": "bookworm"}
    assert state["packages"] == {"nvidia-smi": {"version": "535.261.03-1", "held": True},
                                 "libcuda1": {"version": "535.261.03-1", "held": False}}
    assert state["modules"] == ["nouveau"] and state["headers_candidate"] is None
    assert state["release"] == "6.18.44-fc" and state["headers"] is False


def test_headers_secure_boot_distribution_and_serving_refusals():
    d = data(nvidia_driver_branch=535)
    no_headers = dict(DEBIAN, headers=False, headers_candidate=None, release="6.18.44-fc")
    facts = bare(host_state=no_headers)
    [r] = check_headers(plan_of(facts, d), facts, d)
    assert "6.18.44-fc" in r.what and "linux-headers-6.18.44-fc" in r.why
    assert check_headers(plan_of(facts, d), facts, data(nvidia_driver_branch=535, nvidia_driver_headers=False)) == []
    facts = bare(host_state=dict(no_headers, headers_candidate="6.18.44-1"))
    assert check_headers(plan_of(facts, d), facts, d) == []
    facts = bare(secure_boot=True)
    [r] = check_secure_boot(plan_of(facts, d), facts, d)
    assert "mokutil" in r.fix
    facts = bare(host_state=dict(DEBIAN, os={"id": "fedora", "version_id": "41"}))
    [r] = check_distribution(plan_of(facts, d), facts, d)
    assert "fedora 41" in r.what
    plan, facts = host("a100", serving_units=["rigup-llama@glm.service"])
    facts["reads"] = {"DriverHost": DEBIAN}
    p = plan_of(facts, d)
    [r] = check_serving(p, facts, d)
    assert "roll.py" in r.fix and "rigup-llama@glm.service" in r.why
    assert check_serving(p, facts, data(nvidia_driver_branch=535, rigup_rolling=True)) == []
    assert check_serving(p, facts, data(nvidia_driver_branch=535, rigup_maintenance=True)) == []


def test_cuda_is_held_to_the_pinned_branch_before_any_change():
    # a CUDA 12.8 toolkit on a loaded driver whose highest CUDA is older (535: 12.2)
    plan, facts = host("a100", driver="535.261.03")
    [r] = check_driver_for_cuda(plan, facts, data(cuda_version="12.8"))
    assert "535.261.03" in r.what and "12.8" in r.what and "570.26" in r.why and "up to 12.2" in r.why
    # the same toolkit on a bare host pinned to branch 535 / 570
    facts = bare()
    [r] = check_driver_for_cuda(plan_of(facts, data(nvidia_driver_branch=535)), facts,
                                data(nvidia_driver_branch=535, cuda_version="12.8"))
    assert "branch 535" in r.what and "12.8" in r.what and "nvidia_driver_branch to 570" in r.fix
    assert check_driver_for_cuda(plan_of(facts, data(nvidia_driver_branch=570)), facts,
                                 data(nvidia_driver_branch=570, cuda_version="12.8")) == []
    # a vLLM wheel built for CUDA 13 on a 570 driver: loaded, and pinned
    vllm = {"vllm_pip_version": "0.33.0+cu130", "vllm_instances": {"glm": {"model": "glm", "port": 8000}},
            "models": {"glm": {"repo": "zai-org/GLM-4.6", "revision": "0" * 40, "size_gib": 10.0}}}
    plan, facts = host("h100", driver="570.195.03")
    [r] = check_wheel_cuda(plan, facts, data(**vllm))
    assert "CUDA 13.0" in r.what and "570.195.03" in r.what and "580.65.06" in r.why
    plan, facts = host("h100", driver="580.105.08")
    facts["reads"] = {"DriverHost": DEBIAN}
    pinned = data(nvidia_driver_branch=570, **vllm)
    [r] = check_wheel_cuda(plan_of(facts, pinned), facts, pinned)
    assert "branch 570" in r.what and "CUDA 13.0" in r.what and "nvidia_driver_branch to 580" in r.fix
    assert driver_for_checks({"driver": {"version": "580.1"}, "driver_step": None}) == ("580.1", "580.1")


def test_a_driver_of_the_branch_from_elsewhere_is_left_as_it_is():
    """The branch answers and none of the distribution's driver packages is installed (a .run
    install): left as it is; one of them installed: the role keeps them at the branch."""
    from roles.nvidia_driver import installed_elsewhere
    plan, facts = host("a100")
    d = data(nvidia_driver_branch=580)
    p = plan_of(dict(facts, reads={"DriverHost": DEBIAN}), d)
    assert installed_elsewhere(p, d, DEBIAN)
    assert not installed_elsewhere(p, d, dict(DEBIAN, packages={"nvidia-kernel-dkms": {"version": "580.1-1", "held": True}}))
    step = plan_of(dict(facts, reads={"DriverHost": DEBIAN}), data(nvidia_driver_branch=535))
    assert not installed_elsewhere(step, data(nvidia_driver_branch=535), DEBIAN)   # another branch: installed


def test_the_cards_compute_capability_against_the_toolkit_and_the_branch():
    """A Volta host (cc 7.0, planned by nvidia-smi: no catalogue card): CUDA 13.0 cannot build for
    it, 12.9 can; branch 590 does not run it, 580 does. An A100 host: both pass."""
    from roles.nvidia_driver.checks import check_branch_cards
    from roles.cuda_toolkit.checks import check_cuda_for_archs
    volta = [{"index": 0, "bus_id": "00000000:07:00.0", "compute_capability": (7, 0), "memory_total_mib": 32768}]
    plan = hardware_plan(volta, {"version": "580.105.08", "loaded": True}, [])
    [r] = check_cuda_for_archs(plan, {}, data(cuda_version="13.0"))
    assert "sm70 (sm_70)" in r.why and "CUDA 13.0 and later" in r.why and "compute capability >= 7.5" in r.why
    assert check_cuda_for_archs(plan, {}, data(cuda_version="12.9")) == []
    [r] = check_branch_cards(plan, {}, data(nvidia_driver_branch=590))
    assert "590" in r.what and "sm70" in r.what and "580" in r.fix
    assert check_branch_cards(plan, {}, data(nvidia_driver_branch=580)) == []
    a100, facts = host("a100")
    assert check_cuda_for_archs(a100, facts, data(cuda_version="13.0")) == []
    assert check_branch_cards(a100, facts, data(nvidia_driver_branch=590)) == []




def test_a_fabric_manager_not_offered_at_the_drivers_release_stops_the_install_first(tmp_path):
    """packages_at_branch's guard, run with bash and an apt-cache whose madison lists what $OFFERED
    names (the lists preflight read were older than this converge's update): the fabric manager of
    another release than the kernel module's candidate $v fails before the install, naming the
    packages and both; NVIDIA's revision of the same release (535.309.01-1 for Debian's
    535.309.01-0+deb12u1) goes on; a host without NVSwitches gets no guard."""
    import os
    import subprocess

    from roles.nvidia_driver import _fabric_at

    stub = tmp_path / "apt-cache"
    stub.write_text('#!/bin/sh\nfor o in $OFFERED; do [ "${o%%=*}" = "$2" ] && '
                    'echo "$2 | ${o#*=} | http://10.213.0.1:8090/_apt ./ Packages"; done; exit 0\n')
    stub.chmod(0o755)
    assert _fabric_at(driver_packages("debian", 535, "proprietary")["packages"]) == ""
    v = "535.309.01-0+deb12u1"
    script = (f"v={v}; u=535.309.01; " + _fabric_at(driver_packages("debian", 535, "proprietary", nvswitch=True)["packages"])
              + "echo installing")
    for fabric, ok in ((v, True), ("535.309.01-1", True), ("535.261.03-1 1:535.309.011-1", False)):
        offered = " ".join(f"{p}={f}" for p in ("nvidia-fabricmanager-535", "libnvidia-nscq-535") for f in fabric.split())
        run = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "OFFERED": offered})
        print(f"fabric manager at {fabric}: exit {run.returncode}, {run.stdout.strip()}{run.stderr.strip()}")
        assert (run.returncode, run.stdout.strip()) == ((0, "installing") if ok else (1, ""))
        assert ok or ("apt offers nvidia-fabricmanager-535 libnvidia-nscq-535 at other versions only, the driver at "
                      f"{v} (the fabric manager must be the driver's release, 535.309.01)") in run.stderr
