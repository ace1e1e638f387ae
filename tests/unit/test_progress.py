"""rigup.progress: the line a host's progress shows, from make's, ninja's and pip's logs."""

import re

from rigup.progress import PROGRESS, parse_probe, progress_text, start_command


def test_ninja_make_and_pip_lines():
    assert progress_text("[123/456] Building CXX object ggml/src/ggml.c.o") == "[123/456] 26%"
    assert progress_text("[ 27%] Building C object ggml/src/CMakeFiles/ggml-base.dir/ggml.c.o") == "27%"
    assert progress_text("[ 58%] Building CXX object ggml/src/ggml-cpu/ops.cpp.o", high=80) == "80%"   # make -j: out of order
    assert progress_text("  Downloading torch-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl (899.7 MB)") == \
        "Downloading torch-2.9.0-cp311-cp311-manylinux_2_28_x86_64.whl (899.7 MB)"
    assert len(progress_text("Installing collected packages: " + "x, " * 100)) == 100


def test_the_host_side_pattern_keeps_progress_lines_only():
    pattern = re.compile(PROGRESS)
    kept = [line for line in ["[ 27%] Building C object a.o", "[12/40] Linking CXX executable bin/x",
                              "  Downloading torch-2.9.0.whl (899.7 MB)", "Installing collected packages: a, b",
                              "/src/ggml.c:12: warning: unused", "-- Configuring done"] if pattern.search(line)]
    assert len(kept) == 4


def test_probe_output_and_start_command():
    assert parse_probe(["running=0", "done=1", "line=[ 99%] Linking", "last=-- Configuring"]) == \
        {"running": False, "done": True, "line": "[ 99%] Linking", "last": "-- Configuring"}
    text = start_command("rigup-x.service", "/opt/x.sh", "/opt/x log", systemd=True, unless="/opt/x.json")
    assert "systemd-run --unit=rigup-x.service" in text and "'/opt/x log'" in text
    assert text.startswith("while systemctl is-active -q rigup-x.service")
    assert "echo $! >" in start_command("u", "c", "/l", systemd=False)
