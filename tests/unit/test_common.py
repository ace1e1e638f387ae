"""rigup: the one-round-trip file states and the shared template renderer."""

from rigup.templates import render
from pathlib import Path

from rigup.files import parse_file_states


def test_file_states_parse_stat_then_the_hashes():
    paths = ["/etc/a.conf", "/opt/rigup", "/nope", "/etc/link", "/etc/unhashed"]
    lines = ["root root 644 regular file\t/etc/a.conf", "root root 755 directory\t/opt/rigup",
             "root root 777 symbolic link\t/etc/link", "root root 600 regular empty file\t/etc/unhashed",
             "##sha", "ab" * 32 + "  /etc/a.conf"]
    got = parse_file_states(paths, lines)
    assert got["/etc/a.conf"] == {"user": "root", "group": "root", "mode": "644", "kind": "f", "sha256": "ab" * 32}
    assert got["/opt/rigup"]["kind"] == "d" and got["/nope"] is None and got["/etc/link"]["kind"] == "l"
    assert got["/etc/unhashed"] is None   # a regular file sha256sum did not answer for reads as missing


def test_file_states_in_a_real_shell(tmp_path):
    """Every kind of path, in one stat and one sha256sum (a name with a space and a quote too)."""
    import hashlib
    import os
    import subprocess

    from rigup.files import FileStates

    (tmp_path / "f").write_text("x")
    (tmp_path / "empty").write_text("")
    (tmp_path / "it's a file").write_text("y")
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "f")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    os.mkfifo(tmp_path / "fifo")
    os.chmod(tmp_path / "f", 0o640)
    names = ["f", "empty", "it's a file", "d", "l", "dangling", "fifo", "missing", "f"]
    fact = FileStates()
    command = fact.command(paths=[str(tmp_path / n) for n in names])
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0
    got = {Path(p).name: v for p, v in fact.process(out.stdout.splitlines()).items()}
    assert got["f"]["mode"] == "640" and got["f"]["kind"] == "f" and got["f"]["sha256"] == hashlib.sha256(b"x").hexdigest()
    assert got["empty"]["sha256"] == hashlib.sha256(b"").hexdigest()
    assert got["it's a file"]["sha256"] == hashlib.sha256(b"y").hexdigest()
    assert (got["d"]["kind"], got["d"]["sha256"]) == ("d", "-")
    assert got["l"]["kind"] == got["dangling"]["kind"] == "l" and got["l"]["sha256"] == "-"
    assert got["fifo"] is None and got["missing"] is None
    assert command.count("stat ") == 1 and command.count("sha256sum") == 1


def test_render_is_strict_and_keeps_the_trailing_newline():
    import jinja2
    import pytest

    text = render("gpu_power-udev.rules.j2", unit="rigup-gpu-power.service")
    assert text.endswith("restart rigup-gpu-power.service\"\n")
    with pytest.raises(jinja2.UndefinedError):
        render("gpu_power-udev.rules.j2")
