"""Issue 61, round 13: the GPU guard's trips fail closed when their record cannot be written (GG1: an
Xid or fabric trip, trip_now; GG2: the debounced trip of check), and the Xid triage's card key keeps
the whole PCI domain (XD6). The lab's nvidia-smi and a systemctl stand-in on PATH; no unit of this
machine is touched."""
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shipped import xid
from roles.gpu_guard.shipped import guard as G

LAB = Path(__file__).resolve().parents[1] / "lab"
UNIT = "rigup-llama@m.service"


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The lab's nvidia-smi (a100) and a systemctl stand-in first on PATH: one serving unit running; a
    stop or a reboot leaves an empty file of its verb in ``bin/`` (empty: written under RLIMIT_FSIZE 0 too)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(json.loads((LAB / "gpu_profiles.json").read_text())["a100"]))
    (bin_dir / "nvidia-smi").symlink_to(LAB / "nvidia_smi.py")
    (bin_dir / "systemctl").write_text(
        f'#!/bin/sh\ncase "$1" in list-units) echo "{UNIT} loaded active running x";; '
        'stop|reboot) : > "$(dirname "$0")/$1";; esac\nexit 0\n')
    (bin_dir / "systemctl").chmod(0o755)
    for key, value in (("RIGUP_GPU_SIM_PROFILE", profile), ("RIGUP_GPU_SIM_RUN", tmp_path / "run"),
                       ("RIGUP_GPU_SIM_LIB", tmp_path / "lib"), ("PATH", f"{bin_dir}:{os.environ['PATH']}")):
        monkeypatch.setenv(key, str(value))
    (tmp_path / "notadir").write_text("x")   # a directory that is a file: every write under it fails
    return tmp_path


def config_of(tmp_path, tripped: str, **more) -> dict:
    return {"tripped_file": tripped, "samples_file": str(tmp_path / "samples.json"), "units": ["rigup-llama@*"],
            "window_s": 10, "interval_s": 2, "smi_timeout_s": 10, "default": {"temp_c": 85, "draw_w": 800},
            "by_pci_id": {}, **more}


@pytest.mark.parametrize("reboot", [False, True])
def test_an_xid_trip_whose_record_cannot_be_written_stops_the_units_and_says_why(host, capsys, reboot):
    """GG1: trip_now's save raised (FileExistsError here; ENOSPC, EROFS alike) before the stop: a
    traceback, the card's units serving. Now they stop, the journal line says why, the check ends 1,
    and a reboot trip does not reboot (the units would start at boot with no trip on file)."""
    config = config_of(host, str(host / "notadir" / "tripped.json"),
                       xid={"state_file": str(host / "xid.json"), "reboot": True, "reboots_file": str(host / "reboots.json")})
    assert G.trip_now(config, {"reason": "Xid 79 on GPU 0", "reboot": reboot}, [], 1e9) == 1
    out = capsys.readouterr().out
    print(out)
    assert (host / "bin" / "stop").exists() and not (host / "bin" / "reboot").exists()
    line = next(ln for ln in out.splitlines() if "TRIPPED" in ln)
    assert line.startswith("<2>rigup-gpu-guard: TRIPPED: Xid 79 on GPU 0; stopped serving units: " + UNIT)
    assert f"its record is not written (cannot write {host}/notadir/tripped.json: " in line
    assert ("not rebooting; " in line) is reboot and "Traceback" not in out
    assert not (host / "reboots.json").exists()


def test_a_reboot_trip_whose_count_cannot_be_written_stops_but_does_not_reboot(host, capsys):
    """The day's reboot count bounds the reboots: one that cannot be kept bounds none, so no reboot; the
    trip is on file and holds the units stopped."""
    config = config_of(host, str(host / "tripped.json"),
                       xid={"state_file": str(host / "xid.json"), "reboot": True, "reboots_file": str(host / "notadir" / "r.json")})
    assert G.trip_now(config, {"reason": "Xid 79 on GPU 0", "reboot": True}, [], 1e9) == 1
    out = capsys.readouterr().out
    assert (host / "bin" / "stop").exists() and not (host / "bin" / "reboot").exists()
    assert json.loads((host / "tripped.json").read_text())["stopped"] == [UNIT]
    assert "not rebooting (the day's reboots are not counted: cannot write" in out


def test_a_debounced_trip_whose_record_cannot_be_written_stops_the_units(host, capsys):
    """GG2: check() saved the tripped record before stop_serving, as trip_now did."""
    subprocess.run(["nvidia-smi", "sim", "set", "-i", "3", "--na", "power.draw"], check=True)
    assert G.check(config_of(host, str(host / "notadir" / "tripped.json"))) == 1
    out = capsys.readouterr().out
    print(out)
    assert (host / "bin" / "stop").exists()
    assert "TRIPPED: telemetry lost" in out and "its record is not written (cannot write" in out


def test_a_full_disk_still_trips_closed_and_exits_1_without_a_traceback(host):
    """GG1/GG2 on a full disk (RLIMIT_FSIZE 0: every write fails with EFBIG, as ENOSPC would): the samples,
    the metrics and the tripped record all fail; the guard's own process still stops the units and exits 1."""
    subprocess.run(["nvidia-smi", "sim", "set", "-i", "3", "--na", "power.draw"], check=True)
    (host / "cfg.json").write_text(json.dumps(config_of(host, str(host / "tripped.json"),
                                                        metrics_file=str(host / "m.prom"))))

    def full():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    done = subprocess.run([sys.executable, G.__file__, "--config", str(host / "cfg.json"), "check"],
                          capture_output=True, text=True, timeout=120, preexec_fn=full)
    print(done.stdout, done.stderr)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (host / "bin" / "stop").exists() and not (host / "tripped.json").exists()
    assert "<3>rigup-gpu-guard: cannot write " + str(host / "samples.json") + ": File too large" in done.stdout
    assert "TRIPPED: telemetry lost" in done.stdout and "its record is not written" in done.stdout


@pytest.mark.parametrize("smi, line, key", [
    ("00000000:2B:00.0", "NVRM: Xid (PCI:0000:2b:00): 79, pid=1, GPU has fallen off the bus.", "0000:2b:00"),
    ("00010000:2B:00.0", "NVRM: Xid (PCI:10000:2b:00): 79, pid=1, GPU has fallen off the bus.", "10000:2b:00"),
    ("0000ABCD:2B:00.0", "NVRM: Xid (abcd:2b:00): 13, Graphics Exception", "abcd:2b:00"),
])
def test_the_xid_key_keeps_the_whole_pci_domain(smi, line, key):
    """XD6: the key was the domain's last 4 digits: VMD's domain 10000 and domain 0000 were one card, an
    Xid of one acted on the other's units. nvidia-smi's bus id (the guard's sample), sysfs's name and the
    driver's line give one key; domains 0000 and 10000 two."""
    assert xid.card_key(smi) == G.card_key_of({"bus_id": smi}) == key
    assert xid.card_key(key + ".0") == key   # sysfs's device name (nvidia_pci_cards)
    assert [e["card"] for e in xid.events([line], {})] == [key]


def test_domains_0000_and_10000_are_two_cards():
    assert xid.card_key("00010000:2B:00.0") != xid.card_key("00000000:2B:00.0")
    assert len({xid.card_key(b) for b in ("10000:2b:00", "00010000:2b:00", "0000:2b:00", "00000000:2b:00")}) == 2


def test_clear_with_a_directory_in_place_of_its_trip_file_says_so_and_stays_tripped(host, capsys):
    """Round 32 G32a: ``clear`` removed the trip file with os.remove: a directory there (only root makes one in
    the guard's state directory: a broken host) ended it in an IsADirectoryError traceback. Now one line, exit 1,
    the trip and the samples left as they were."""
    tripped = host / "tripped.json"
    tripped.mkdir()
    (host / "samples.json").write_text("[]")
    path = host / "guard.json"
    path.write_text(json.dumps(config_of(host, str(tripped))))
    assert G.main(["--config", str(path), "clear"]) == 1
    err = capsys.readouterr().err
    print("said:", err.strip())
    assert err.count("\n") == 1 and f"not cleared: cannot remove {tripped}: Is a directory" in err
    assert tripped.is_dir() and (host / "samples.json").exists()
