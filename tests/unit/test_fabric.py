"""An HGX/DGX host's NVSwitch fabric (rigup/gpu/fabric.py; issue 48): read in the one hardware
read, shown in the plan, judged before any change (roles/nvidia_driver check_fabric), and on Ubuntu
installed with the driver at its branch. What the lent H200 machine reported (read only,
2026-12-04, driver 580.159.04): one card, no NVSwitch on its PCI bus, ``fabric.state`` and
``fabric.status`` N/A: no fabric line, nothing refused, nothing installed."""

import pytest
from hypothesis import given, settings, strategies as st

from rigup.gpu import fabric
from rigup.gpu.facts import parse_gpus, parse_hardware
from roles.nvidia_driver.checks import check_fabric
from roles.nvidia_driver.packages import driver_packages
from tests.unit.hosts import data, host

# PCI_COMMAND's lines on an 8 x A100 SXM4 HGX board: 8 cards, 6 NVSwitches (class 0x068000)
HGX_PCI = ([f"0000:{b}:00.0 0x20b2 0x030200" for b in ("07", "0f", "47", "4e", "87", "90", "b7", "bd")]
           + [f"0000:{b}:00.0 0x1af1 0x068000" for b in ("c4", "c5", "c6", "c7", "c8", "c9")])
FM_UBUNTU = ["fm nvidia-fabricmanager-580 580.105.08-0ubuntu1 ii ", "fm nvidia-fabricmanager-dev-580 580.105.08-0ubuntu1 ii ",
             "active active"]
H200_ROW = "0, GPU-46c2, 00000000:00:06.0, 0x233510DE, NVIDIA H200, 9.0, 143771, 0, 700.00, 200.00, 700.00, 700.00, " \
           "124.00, 35, Enabled, 5, 16, 580.159.04, 5, 16"


def plan_with(fabric_value, driver="580.105.08"):
    plan, _ = host("a100")
    return {**plan, "driver": {**plan["driver"], "version": driver}, "fabric": fabric_value}


def test_nvswitches_and_the_fabric_manager_are_read_only_where_they_are():
    assert fabric.parse_nvswitches(HGX_PCI) == [f"0000:{b}:00.0" for b in ("c4", "c5", "c6", "c7", "c8", "c9")]
    assert fabric.parse_manager(FM_UBUNTU) == {"version": "580.105.08", "package": "nvidia-fabricmanager-580",
                                               "active": "active", "nvlinks": None}
    assert fabric.parse_manager([]) == {"version": None, "package": None, "active": None, "nvlinks": None}
    assert fabric.parse_manager(["fm nvidia-fabricmanager 1:575.57.08-1 rc ", "active inactive"])["version"] is None
    # held with the driver, as rigup installs it (dpkg's "hi"): installed
    assert fabric.parse_manager(["fm nvidia-fabricmanager-535 535.309.01-0+deb12u1 hi ", "active active"])["version"] \
        == "535.309.01"
    hw = parse_hardware(["##rigup:pci", *HGX_PCI, "##rigup:fabric", *FM_UBUNTU])
    assert len(hw["pci"]) == 8 and len(hw["nvswitches"]) == 6 and hw["fabric_manager"]["version"] == "580.105.08"


def test_the_cards_fabric_state_is_read_where_the_driver_knows_it_and_bounded():
    (h200,) = parse_gpus([H200_ROW + ", N/A, N/A"])           # as the lent H200 answered: one card, passed through
    assert h200["fabric_state"] is None and h200["fabric_status"] is None and h200["name"] == "NVIDIA H200"
    assert parse_gpus([H200_ROW])[0].get("fabric_state") is None      # a driver without the fields: read again without
    (hopper,) = parse_gpus([H200_ROW + ", Completed, Success"])
    assert (hopper["fabric_state"], hopper["fabric_status"]) == ("Completed", "Success")
    assert parse_gpus([H200_ROW + ", \x1b[31mComplete, Success"])[0]["fabric_state"] == "unreadable"
    assert fabric.fabric_plan([], [h200], None) is None                # the H200 machine: no fabric line at all


def test_the_plan_line_names_switches_manager_and_states():
    cards = [{"fabric_state": "Completed", "fabric_status": "Success"}] * 8
    hgx = fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), cards, fabric.parse_manager(FM_UBUNTU))
    assert fabric.line(hgx) == "fabric:    6 x NVSwitch, fabric manager 580.105.08 active, 8 cards Completed/Success"
    vm = fabric.fabric_plan([], [{"fabric_state": "In Progress"}] * 8, None)
    assert vm["nvswitches"] == 0 and fabric.line(vm).startswith("fabric:    no NVSwitch on this PCI bus (a VM of an HGX host")
    assert fabric.line(vm).endswith("8 cards In Progress")


def test_a_fabric_manager_of_another_version_or_none_on_debian_is_refused_naming_both():
    hgx = fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), [], fabric.parse_manager(FM_UBUNTU))
    ubuntu = {"reads": {"DriverHost": {"os": {"id": "ubuntu"}}}}
    assert check_fabric(plan_with(hgx), ubuntu, data()) == []                       # the same version
    (r,) = check_fabric(plan_with(hgx, "580.95.05"), ubuntu, data())
    assert "fabric manager 580.105.08, driver 580.95.05" in r.line("h") and "error 802" in r.why
    assert "nvidia-fabricmanager-580" in r.fix and r.check == "driver_fabric"
    assert check_fabric(plan_with(hgx, "580.95.05") | {"driver_step": {"branch": 590}}, ubuntu, data()) == []
    bare = fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), [], None)
    debian = {"reads": {"DriverHost": {"os": {"id": "debian"}}}}
    (r,) = check_fabric(plan_with(bare), debian, data(nvidia_driver_branch=535))
    assert "no nvidia-fabricmanager-535 in its sources" in r.what and "Debian's driver packages ship no" in r.why
    assert "NVIDIA's CUDA repository" in r.fix
    other = {"reads": {"DriverHost": {"os": {"id": "debian"}, "fabric_candidates": {"nvidia-fabricmanager-535": "550.1-1"}}}}
    (r,) = check_fabric(plan_with(bare), other, data(nvidia_driver_branch=535))
    assert "(they offer 550.1-1)" in r.what
    # a source that has it (NVIDIA's CUDA repository; the lab's stand-in repository): installed with the driver
    offered = {"reads": {"DriverHost": {"os": {"id": "debian"}, "fabric_candidates": {"nvidia-fabricmanager-535": "535.261.03-1"}}}}
    assert check_fabric(plan_with(bare), offered, data(nvidia_driver_branch=535)) == []
    assert check_fabric(plan_with(None), debian, data(nvidia_driver_branch=535)) == []     # no NVSwitch: nothing new


def test_ubuntu_installs_the_fabric_manager_of_the_drivers_branch_only_on_nvswitch_hosts():
    assert driver_packages("ubuntu", 580, "open")["packages"] == ["nvidia-headless-580-server-open", "nvidia-utils-580-server"]
    assert driver_packages("ubuntu", 580, "open", nvswitch=True)["packages"][2:] == ["nvidia-fabricmanager-580",
                                                                                    "libnvidia-nscq-580"]
    assert driver_packages("debian", 535, "proprietary", nvswitch=True)["packages"] == \
        driver_packages("debian", 535, "proprietary")["packages"] + ["nvidia-fabricmanager-535", "libnvidia-nscq-535"]


def test_a_fabric_manager_offered_at_other_versions_than_the_driver_is_refused_naming_both():
    """Debian pins every package of the driver to the kernel module's candidate: a source that has
    the branch's fabric manager only at another version is refused before any change (the fact's
    madison lines read as DriverHost does)."""
    from roles.nvidia_driver.facts import parse_driver_host

    bare = fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), [], None)
    lines = ["##rigup-driver:os", "ID=debian", "##rigup-driver:fabric",    # apt-cache policy's, as Debian 12's prints it
             "nvidia-fabricmanager-535:", "  Installed: (none)", "  Candidate: 535.999.01-1", "  Version table:",
             "     535.999.01-1 500", "        500 http://10.213.0.1:8090/_apt ./ Packages",
             "     535.261.03-1 500", "        500 http://10.213.0.1:8090/_apt ./ Packages",
             "     535.100.01-1 100", "        100 /var/lib/dpkg/status",   # only installed: not offered
             "nvidia-kernel-dkms:", "  Installed: (none)", "  Candidate: 535.309.01-0+deb12u1", "  Version table:",
             " *** 535.309.01-0+deb12u1 500", "        500 http://deb.debian.org/debian bookworm-updates/non-free amd64 "
             "Packages", "        100 /var/lib/dpkg/status",
             "nvidia-open-kernel-dkms:", "  Installed: (none)", "  Candidate: (none)", "  Version table:"]
    host = parse_driver_host(lines)
    assert host["fabric_offers"] == {"nvidia-fabricmanager-535": ["535.999.01-1", "535.261.03-1"]}
    assert host["module_candidates"] == {"nvidia-kernel-dkms": "535.309.01-0+deb12u1"}
    (r,) = check_fabric(plan_with(bare), {"reads": {"DriverHost": host}}, data(nvidia_driver_branch=535))
    print(r.line("hgx-01"))
    assert r.what == ("NVSwitch host: its sources offer nvidia-fabricmanager-535 at 535.999.01-1, 535.261.03-1, "
                      "the driver at 535.309.01-0+deb12u1") and r.check == "driver_fabric"
    lines[7:7] = ["     535.309.01-0+deb12u1 500 (phased 20%)",          # the driver's version too (Ubuntu phases)
                  "        500 http://10.213.0.1:8090/_apt ./ Packages"]
    assert check_fabric(plan_with(bare), {"reads": {"DriverHost": parse_driver_host(lines)}},
                        data(nvidia_driver_branch=535)) == []
    lines[7:9] = ["     535.309.01-1 500",                                 # NVIDIA's revision of that release
                  "        500 http://10.213.0.1:8090/_apt ./ Packages"]
    assert check_fabric(plan_with(bare), {"reads": {"DriverHost": parse_driver_host(lines)}},
                        data(nvidia_driver_branch=535)) == []


# nvidia-smi nvlink -s on an HGX A100 (12 links a card), as MANAGER_COMMAND prefixes its lines
NVLINK_A100 = [line for g in range(8) for line in
               [f"nvl GPU {g}: NVIDIA A100-SXM4-80GB (UUID: GPU-{g})",
                *(f"nvl \t Link {k}: {'<inactive>' if (g, k) == (3, 11) else '25 GB/s'}" for k in range(12))]]


def test_nvlinks_per_card_are_read_and_named_in_the_plan():
    """Ampere reports no fabric state: its NVLinks (with the fabric manager's service) say whether
    the fabric is up; the plan names them, as the issue's example line."""
    links = fabric.parse_nvlinks(NVLINK_A100)
    assert links == {"up": 11, "most": 12, "links": 12, "cards": 8, "unreadable": 0}
    assert fabric.parse_nvlinks(["nvl GPU 0: NVIDIA H200 (UUID: GPU-x)"]) is None       # a card with none
    manager = {**fabric.parse_manager(FM_UBUNTU), "nvlinks": links}
    line = fabric.line(fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), [], manager))
    print(line)
    assert line == ("fabric:    6 x NVSwitch, fabric manager 580.105.08 active, NVLinks up per GPU: 11 to 12 of 12")
    whole = fabric.parse_nvlinks([ln.replace("<inactive>", "25 GB/s") for ln in NVLINK_A100])
    assert fabric.line(fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), [], {**manager, "nvlinks": whole})) \
        == "fabric:    6 x NVSwitch, fabric manager 580.105.08 active, 12 NVLinks up per GPU"


@pytest.mark.parametrize("lines, want", [
    # issue 61, second round: Link 0 listed 18 times was 18 links up; 0 GB/s and N/A were up
    (["nvl GPU 0: H100"] + ["nvl \t Link 0: 26.562 GB/s"] * 18, {"up": 0, "links": 1, "unreadable": 1}),
    (["nvl GPU 0: H100", "nvl Link 0: 0 GB/s", "nvl Link 1: N/A"], {"up": 0, "links": 2, "unreadable": 0}),
    (["nvl GPU 0: H100", "nvl Link 0: 25 GB/s", "nvl Link x: 25 GB/s"], {"up": 0, "links": 2, "unreadable": 1}),
    # round 4: a card naming no link was dropped, and 12 up of 12 on the other read whole
    (["nvl GPU 0: H100", *(f"nvl Link {k}: 25 GB/s" for k in range(12)), "nvl GPU 1: H100"],
     {"up": 0, "links": 12, "cards": 2, "unreadable": 0}),
    (["nvl GPU 0: H100", "nvl Link 0: inf GB/s", "nvl Link 1: -25 GB/s", "nvl Link 2: 25 MB/s", "nvl Link 3: 25"],
     {"up": 0, "links": 4, "unreadable": 0}),
])
def test_a_link_named_twice_or_at_no_speed_is_not_up(lines, want):
    links = fabric.parse_nvlinks(lines)
    manager = {**fabric.parse_manager(FM_UBUNTU), "nvlinks": links}
    line = fabric.line(fabric.fabric_plan(fabric.parse_nvswitches(HGX_PCI), [], manager))
    print(f"\n{lines[1:3]}: {links}\n{line}")
    assert {k: links[k] for k in want} == want and links["up"] < links["links"]
    assert ("unreadable" in line) == bool(want["unreadable"])


LINK_TEXT = st.sampled_from(["25 GB/s", "26.562 GB/s", "0 GB/s", "N/A", "<inactive>", "inf GB/s", "nan GB/s",
                             "-1 GB/s", "1e3 GB/s", "٢٥ GB/s", "25", ""]) | st.text(max_size=12)


@settings(max_examples=60, deadline=1000)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["0", "1", "2", "x", "-1", "00", ""]) | st.text(
                                       st.characters(blacklist_characters=":"), max_size=3),
                                   LINK_TEXT), max_size=6), max_size=4))
def test_nvlinks_count_each_link_once_up_only_at_a_speed(cards):
    """Any listing: up at most the links a card named once, and only at a positive finite GB/s; a card
    that names a link twice or by no whole number is unreadable, none of its links up."""
    lines = [ln for i, links in enumerate(cards) for ln in
             [f"nvl GPU {i}: X"] + [f"nvl \t Link {k}: {t}" for k, t in links]]
    got = fabric.parse_nvlinks(lines)
    listed = [links for links in cards if links]
    if not listed:
        assert got is None
        return
    ups = []
    for links in cards:   # a card that names no link, among cards that do, counts with none up
        keys = [k.strip() for k, _ in links]
        readable = all(k.isascii() and k.isdigit() and (k == "0" or k[0] != "0") for k in keys) and \
            len(set(keys)) == len(keys)
        ups.append(sum(1 for _, t in links if readable and t.split()[1:] == ["GB/s"] and len(t.split()) == 2
                       and fabric.number(t.split()[0], float, lo=0)) if readable else 0)
    assert got["cards"] == len(cards) and got["up"] == min(ups) and got["most"] == max(ups)
    assert 0 <= got["up"] <= got["most"] <= got["links"]


def test_a_branch_change_takes_the_old_branchs_fabric_manager_out_in_the_same_transaction():
    """issue 48, found by the lab's driver roll on NVSwitch hosts: the old branch's fabric manager,
    held with its driver, conflicts with the new one's and apt will not take a held package out
    ('pkgProblemResolver::Resolve generated breaks'): rigup unholds it and names it for removal."""
    from roles.nvidia_driver.packages import other_fabric
    installed = {p: {"version": "580.105.08-1", "held": True}
                 for p in ("nvidia-fabricmanager-580", "libnvidia-nscq-580", "nvidia-smi", "nvidia-fabricmanager-dev-580")}
    wanted = driver_packages("debian", 535, "proprietary", nvswitch=True)["packages"]
    assert other_fabric(installed, wanted) == ["libnvidia-nscq-580", "nvidia-fabricmanager-580"]
    assert other_fabric({p: {} for p in wanted}, wanted) == []
