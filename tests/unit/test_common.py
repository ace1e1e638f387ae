"""rigup: the one-round-trip file states and the shared template renderer."""

from rigup.templates import render
from rigup.files import parse_file_states


def test_file_states_one_line_per_path_in_order():
    paths = ["/etc/a.conf", "/opt/rigup", "/nope", "/etc/link"]
    lines = ["root root 644 f " + "ab" * 32, "root root 755 d -", "missing", "root root 777 l -"]
    got = parse_file_states(paths, lines)
    assert got["/etc/a.conf"] == {"user": "root", "group": "root", "mode": "644", "kind": "f", "sha256": "ab" * 32}
    assert got["/opt/rigup"]["kind"] == "d" and got["/nope"] is None and got["/etc/link"]["kind"] == "l"


def test_render_is_strict_and_keeps_the_trailing_newline():
    import jinja2
    import pytest

    text = render("gpu_power-udev.rules.j2", unit="rigup-gpu-power.service")
    assert text.endswith("restart rigup-gpu-power.service\"\n")
    with pytest.raises(jinja2.UndefinedError):
        render("gpu_power-udev.rules.j2")
