"""shipped/xid.py on kernel log lines as drivers write them, and rigup.gpu.plan.link_state."""

import pytest

from shipped import xid
from rigup.gpu.catalogue import xid_codes
from rigup.gpu.plan import link_state

LOG = [
    "[ 269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff",
    "May 18 19:02:39 kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "May 18 19:02:39 kernel: NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.",
    "May 13 17:19:01 hyperion kernel: NVRM: Xid (PCI:0000:08:00): 31, Ch 0000003b, intr 10000000. MMU Fault",
    "NVRM: Xid (PCI:0000:08:00): 13, pid=5678, name=python3, Graphics Exception: ESR 0x50",
    "NVRM: Xid (PCI:0000:c3:00): 48, pid=1, DBE (double bit error) ECC error",
    "kernel: nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver",
]


def test_every_xid_line_is_attributed_to_its_card_and_classified():
    found = xid.events(LOG, xid_codes())
    assert [(e["card"], e["code"], e["class"], e["action"]) for e in found] == [
        ("0000:01:00", 3, "unknown", "log"), ("0000:2b:00", 79, "bus", "drain_host"),
        ("0000:08:00", 31, "application", "restart"), ("0000:08:00", 13, "application", "restart"),
        ("0000:c3:00", 48, "memory", "suspect")]
    assert found[1]["text"] == "GPU has fallen off the bus." and found[1]["line"] == LOG[1]
    assert xid.counts(found) == {"0000:01:00": {"unknown": 1}, "0000:2b:00": {"bus": 1},
                                 "0000:08:00": {"application": 2}, "0000:c3:00": {"memory": 1}}
    assert xid.events([], xid_codes()) == []          # the H200's log: no Xid line is a valid answer


@pytest.mark.parametrize("line", [
    "Out of memory: Killed process 4242 (NVRM: Xid (PCI:0000:2b:00): 79, x) total-vm:1kB",
    "usb 1-1: Product: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
    "[ 269.517039] audit: comm=\"NVRM: Xid (PCI:0000:2b:00): 79, \"",
    "May 18 19:02:39 host sshd[1]: Invalid user NVRM: Xid (PCI:0000:2b:00): 79, from 10.0.0.9",
])
def test_an_xid_quoted_inside_another_message_is_not_an_xid(line):
    """Issue 47: only the driver's own line shape, from the message's start (behind a log prefix)."""
    assert xid.events([line], xid_codes()) == []
    assert xid.events(["[  269.517039] rig kernel: NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus."],
                      xid_codes())[0]["code"] == 79     # journalctl -k -o short-monotonic's own prefix


def test_bus_ids_of_nvidia_smi_and_of_the_log_name_the_same_card():
    assert xid.card_key("00000000:2B:00.0") == xid.card_key("PCI:0000:2b:00") == "0000:2b:00"
    with pytest.raises(ValueError):
        xid.card_key("2b:00")


def test_the_catalogue_is_well_formed():
    known = xid_codes()
    assert {8, 13, 31, 43, 48, 63, 74, 79, 94, 95, 119} <= set(known)
    for code, entry in known.items():
        assert entry["class"] in ("application", "memory", "bus", "driver"), code
        assert entry["action"] in ("restart", "suspect", "drain_host", "log"), code
        assert entry["meaning"], code


def test_a_narrow_link_is_flagged_and_an_idle_generation_is_not():
    assert link_state(5, 5, 16, 16) == {"link": "x16 Gen5", "downtrained": False, "why": ""}
    assert link_state(1, 4, 16, 16) == {"link": "x16 Gen1", "downtrained": False, "why": ""}   # idle
    assert link_state(1, 4, 16, 16, loaded=True)["why"] == "Gen1 of Gen4 under load"
    assert link_state(4, 4, 4, 16) == {"link": "x4 Gen4", "downtrained": True, "why": "x4 of x16"}
    assert link_state(None, None, 16, None, loaded=True)["downtrained"] is False          # [N/A]: unknown
