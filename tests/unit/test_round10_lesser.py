"""Round 10 of issue 61, lesser cases: each refused at its reader (see /tmp/redteam/round10.md)."""

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st
from pyinfra.api.exceptions import InventoryError

from rigup import fleet
from rigup.boundary.numbers import whole


def test_n1_build_ratio_strips_ascii_blanks_alone():
    """N1: 'ratio=1.5\\x85' read 1.5 (str.strip() inside next() took U+0085); ASCII's blanks alone now."""
    for line, want in (("ratio=1.5\x85", None), ("ratio=1.5\u2028", None), ("ratio=1.5\xa0", None),
                       ("ratio= 1.5\t\r", 1.5), ("ratio=1.02", 1.02)):
        got = fleet.parse_build_ratio([line])
        print(f"parse_build_ratio([{line!r}]) -> {got!r} (want {want!r})")
        assert got == want


VAGRANT = Path(__file__).resolve().parents[2] / "inventory" / "vagrant.py"
BLOCK = "Host rigup-vm1\n  HostName 127.0.0.1\n  Port {}\n  IdentityFile /x/.vagrant/machines/rigup-vm1/libvirt/private_key\n"


def _vagrant() -> dict:
    """inventory/vagrant.py's functions, without its `vagrant ssh-config` call."""
    ns: dict = {"__file__": str(VAGRANT)}
    exec(compile(VAGRANT.read_text().split("\nvagrant = ")[0], str(VAGRANT), "exec"), ns)
    return ns


def test_i1_vagrant_port_is_the_boundarys_whole_number():
    """I1: inventory/vagrant.py read Port with int() ('٢٢٢٢', '2_222' -> 2222; 99999, 0 kept; '²' a traceback)."""
    ns, block = _vagrant(), BLOCK
    for port in ("\u0662\u0662\u0662\u0662", "2_222", "\u00b2", "99999", "0", "-22", "2222\x85", "0x16"):
        with pytest.raises(InventoryError) as e:
            ns["_host"](ns["_ssh_configs"](block.format(port))[0])
        print(f"Port {port!r}: refused: {e.value}")
        assert "rigup-vm1" in str(e.value)
    for port, want in (("2222", 2222), ("65535", 65535)):
        got = ns["_host"](ns["_ssh_configs"](block.format(port))[0])[1]["ssh_port"]
        print(f"Port {port!r} -> {got}")
        assert got == want


@settings(max_examples=200, deadline=None)
@given(port=st.text(st.sampled_from(list("0123456789+-._ex\t\x0b\x0c\x85\xa0\u2028\u0662\u00b2")), max_size=8))
def test_i1_vagrant_port_property(port):
    """Any Port text: the port numbers.whole reads (1..65535), or refused naming the VM."""
    ns = _vagrant()
    want = whole(port.strip(" \t\x0b\x0c"), 65535)   # an empty Port too is refused
    try:
        got = ns["_host"](ns["_ssh_configs"](BLOCK.format(port))[0])[1]["ssh_port"]
    except InventoryError as e:
        assert not want and "rigup-vm1" in str(e), port
    else:
        assert got == want and got > 0, port
