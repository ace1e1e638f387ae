"""Tests of the simulated nvidia-smi (tests/lab/nvidia_smi.py), run as a subprocess."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LAB = Path(__file__).resolve().parents[1] / "lab"
SCRIPT = LAB / "nvidia_smi.py"
PROFILES = json.loads((LAB / "gpu_profiles.json").read_text())


class Host:
    """One simulated host: a profile file plus run (tmpfs) and lib (persistent) dirs."""

    def __init__(self, tmp_path, profile):
        self.tmp = tmp_path
        self.run_dir, self.lib_dir = tmp_path / "run", tmp_path / "lib"
        self.profile = tmp_path / "gpu-profile.json"
        if profile is not None:
            self.profile.write_text(json.dumps(PROFILES[profile]))
        self.env = dict(os.environ, RIGUP_GPU_SIM_PROFILE=str(self.profile),
                        RIGUP_GPU_SIM_RUN=str(self.run_dir), RIGUP_GPU_SIM_LIB=str(self.lib_dir))

    def smi(self, *args, argv0=None):
        cmd = [sys.executable, str(argv0 or SCRIPT), *args]
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=10)
        return p.returncode, p.stdout

    def ok(self, *args):
        rc, out = self.smi(*args)
        assert rc == 0, out
        return out

    def csv(self, fields, *extra):
        out = self.ok("--query-gpu=" + fields, "--format=csv,noheader,nounits", *extra)
        return [line.split(", ") for line in out.splitlines()]

    def reboot(self):
        shutil.rmtree(self.run_dir, ignore_errors=True)


@pytest.fixture
def host(tmp_path):
    return lambda profile="a100": Host(tmp_path, profile)


def test_csv_header_units_and_values(host):
    h = host()
    lines = h.ok("--query-gpu=index,name,power.limit,memory.total", "--format=csv").splitlines()
    assert lines[0] == "index, name, power.limit [W], memory.total [MiB]"
    assert lines[1] == "0, NVIDIA A100-SXM4-80GB, 400.00 W, 81920 MiB"
    assert len(lines) == 9


def test_csv_noheader_nounits_all_fields(host):
    h = host()
    fields = ("index,uuid,pci.bus_id,pci.device_id,name,compute_cap,memory.total,memory.used,memory.free,"
              "power.limit,power.min_limit,power.max_limit,power.default_limit,power.draw,temperature.gpu,"
              "persistence_mode,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,"
              "driver_version,clocks.sm,clocks.max.sm,enforced.power.limit")
    rows = h.csv(fields)
    assert len(rows) == 8
    r = dict(zip(fields.split(","), rows[0]))
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", r["uuid"])
    assert r["pci.bus_id"] == "00000000:07:00.0" and r["pci.device_id"] == "0x20B210DE"
    assert (r["compute_cap"], r["memory.total"], r["power.min_limit"], r["power.max_limit"]) == \
        ("8.0", "81920", "100.00", "400.00")
    assert r["persistence_mode"] == "Disabled" and r["driver_version"] == "580.105.08"
    assert r["pcie.link.gen.max"] == "4" and r["pcie.link.width.current"] == "16"
    assert r["enforced.power.limit"] == r["power.limit"] == "400.00"
    assert 50 < float(r["power.draw"]) < 70 and 30 <= int(r["temperature.gpu"]) <= 40
    assert len({row[1] for row in rows}) == 8                    # distinct uuids
    assert h.csv("uuid") == h.csv("uuid")                         # deterministic


def test_header_kept_with_nounits_and_alias_names(host):
    out = host().ok("--query-gpu=gpu_name,power.draw,clocks.sm", "--format=csv,nounits", "-i", "0")
    assert out.splitlines()[0] == "name, power.draw [W], clocks.current.sm [MHz]"
    assert out.splitlines()[1].endswith(", 210")


def test_invalid_field(host):
    rc, out = host().smi("--query-gpu=index,bogus.field", "--format=csv")
    assert rc == 2
    assert out.startswith('Field "bogus.field" is not a valid field to query.')


def test_power_limit_out_of_range(host):
    h = host()
    rc, out = h.smi("-i", "0", "-pl", "999")
    assert rc != 0 and rc == 2
    assert out.splitlines() == [
        "Provided power limit 999.00 W is not a valid power limit which should be between "
        "100.00 W and 400.00 W for GPU 00000000:07:00.0",
        "Terminating early due to previous errors."]
    assert h.csv("power.limit", "-i", "0") == [["400.00"]]


def test_power_limit_set_and_read_back(host):
    h = host()
    out = h.ok("-i", "0", "-pl", "300")
    assert out.splitlines() == ["Power limit for GPU 00000000:07:00.0 was set to 300.00 W from 400.00 W.",
                                "All done."]
    assert h.csv("index,power.limit")[:2] == [["0", "300.00"], ["1", "400.00"]]
    assert "was set to 250.00 W from 300.00 W." in h.ok("--id=0", "--power-limit=250")


def test_bare_power_limit_hits_every_card(host):
    h = host("h100")
    out = h.ok("-pl", "500").splitlines()
    assert len(out) == 5 and out[-1] == "All done."
    assert out[3] == "Power limit for GPU 00000000:5D:00.0 was set to 500.00 W from 700.00 W."
    assert {r[0] for r in h.csv("power.limit")} == {"500.00"}
    rc, out = h.smi("-pl", "50")              # below min: nothing applied, first card reported
    assert rc == 2 and "between 200.00 W and 700.00 W for GPU 00000000:19:00.0" in out
    assert {r[0] for r in h.csv("power.limit")} == {"500.00"}


def test_select_by_uuid_busid_and_list(host):
    h = host()
    uuid3, bus3 = h.csv("uuid,pci.bus_id")[3]
    assert h.csv("index", "-i", uuid3) == [["3"]]
    assert h.csv("index", "-i", bus3) == [["3"]]
    assert h.csv("index", "-i", "4E:00.0,1") == [["3"], ["1"]]
    h.ok("-i", bus3, "-pl", "200")
    assert h.csv("power.limit", "-i", "3") == [["200.00"]]
    assert h.ok("-L", "-i", "3").strip() == "GPU 3: NVIDIA A100-SXM4-80GB (UUID: %s)" % uuid3
    assert len(h.ok("-L").splitlines()) == 8


def test_unknown_target(host):
    h = host()
    for target in ("8", "GPU-00000000-0000-0000-0000-000000000000", "00000000:99:00.0"):
        rc, out = h.smi("-i", target, "--query-gpu=index", "--format=csv")
        assert (rc, out.strip()) == (6, "No devices were found")
    assert h.smi("-i", "9", "-pl", "300") == (6, "No devices were found\n")


def test_persistence_mode(host):
    h = host()
    out = h.ok("-i", "1", "-pm", "1")
    assert out.splitlines() == ["Enabled persistence mode for GPU 00000000:0F:00.0.", "All done."]
    assert "Persistence mode is already Enabled for GPU 00000000:0F:00.0." in h.ok("-i", "1", "-pm", "1")
    assert [r[0] for r in h.csv("persistence_mode")][:3] == ["Disabled", "Enabled", "Disabled"]
    out = h.ok("-pm", "0").splitlines()
    assert out[1] == "Disabled persistence mode for GPU 00000000:0F:00.0."
    assert out[0] == "Persistence mode is already Disabled for GPU 00000000:07:00.0."


def test_reboot_restores_defaults(host):
    h = host()
    h.ok("-pl", "250")
    h.ok("-pm", "1")
    h.ok("-lgc", "1000,1300")
    assert h.csv("power.limit,persistence_mode,clocks.sm", "-i", "0") == [["250.00", "Enabled", "1300"]]
    h.reboot()
    assert h.csv("power.limit,persistence_mode,clocks.sm", "-i", "0") == [["400.00", "Disabled", "210"]]


def test_clock_lock_and_reset(host):
    h = host()
    out = h.ok("-i", "2", "-lgc", "1000,1410")
    assert out.splitlines()[0] == 'GPU clocks set to "(gpuClkMin 1000, gpuClkMax 1410)" for GPU 00000000:47:00.0'
    assert h.csv("clocks.sm,clocks.max.sm", "-i", "2") == [["1410", "1410"]]
    assert h.ok("-i", "2", "-rgc").strip() == "All done."
    assert h.csv("clocks.sm", "-i", "2") == [["210"]]


def test_query_power_section(host):
    h = host("h100")
    h.ok("-i", "0", "-pl", "400")
    out = h.ok("-q", "-d", "POWER", "-i", "0")
    assert "Attached GPUs                                          : 4" in out
    for line in ("Current Power Limit                            : 400.00 W",
                 "Requested Power Limit                          : 400.00 W",
                 "Default Power Limit                            : 700.00 W",
                 "Min Power Limit                                : 200.00 W",
                 "Max Power Limit                                : 700.00 W"):
        assert "        " + line in out.splitlines()


def test_cmp170hx_locked_vs_unlocked(host):
    h = host("cmp170hx")
    assert h.csv("name,memory.total,pci.device_id,pcie.link.gen.max,pcie.link.width.max", "-i", "0") == \
        [["NVIDIA Graphics Device", "8192", "0x20C210DE", "1", "4"]]
    h.ok("sim", "unlock")
    assert (h.lib_dir / "unlocked").exists()
    h.reboot()                                 # the unlock survives reboots
    rows = h.csv("name,memory.total")
    assert len(rows) == 6 and set(map(tuple, rows)) == {("NVIDIA CMP 170HX", "65536")}
    link = h.tmp / "rigup-gpu-sim"
    link.symlink_to(SCRIPT)
    rc, _ = h.smi("lock", argv0=link)
    assert rc == 0 and h.csv("name", "-i", "0") == [["NVIDIA Graphics Device"]]


@pytest.mark.parametrize("profile", ["none", None])
def test_no_driver(host, profile):
    h = host(profile)                         # None: no profile file at all
    for args in ((), ("-L",), ("--query-gpu=index", "--format=csv"), ("-pl", "300")):
        rc, out = h.smi(*args)
        assert rc == 9
        assert out.strip() == ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                               "Make sure that the latest NVIDIA driver is installed and running.")


def test_sim_set_draw_temp_memory(host):
    h = host()
    h.ok("sim", "set", "-i", "1", "--draw", "350.5", "--temp", "71", "--memory-used", "40000")
    assert h.csv("power.draw,temperature.gpu,memory.used,memory.free", "-i", "1") == \
        [["350.50", "71", "40000", "41920"]]
    h.ok("-i", "1", "-pl", "300")            # a capped card cannot draw above its limit
    assert h.csv("power.draw", "-i", "1") == [["300.00"]]
    h.ok("sim", "set", "--temp", "50")       # default target: all cards
    assert {r[0] for r in h.csv("temperature.gpu")} == {"50"}
    shown = json.loads(h.ok("sim", "show"))
    assert shown["profile"] == "a100" and shown["cards"][1]["draw"] == 350.5


def test_lost_card(host):
    h = host()
    h.ok("sim", "set", "-i", "2", "--lost")
    msg = "Unable to determine the device handle for GPU0000:47:00.0: Unknown Error"
    rc, out = h.smi("--query-gpu=index", "--format=csv,noheader")
    assert rc == 15 and out.splitlines() == ["0", "1", msg, "3", "4", "5", "6", "7"]
    assert h.smi() == (15, msg + "\n")
    assert h.smi("-i", "2", "-pl", "300") == (15, msg + "\n")
    assert h.smi("-pm", "1")[0] == 15
    assert h.csv("persistence_mode", "-i", "0") == [["Disabled"]]    # nothing applied
    assert h.csv("index", "-i", "3") == [["3"]]                        # others still answer
    h.ok("sim", "set", "-i", "2", "--found")
    assert len(h.csv("index")) == 8


def test_bad_arguments(host):
    h = host()
    rc, out = h.smi("--bogus")
    assert rc == 2 and out.startswith("ERROR: Option --bogus is not recognized.")
    assert h.smi("--query-gpu=index")[0] == 2           # --format is required
    assert h.smi("-pl", "abc")[0] == 2


def test_plain_summary(host):
    out = host().ok()
    assert "Driver Version: 580.105.08" in out and "CUDA Version: 13.0" in out
    assert out.count("NVIDIA A100-SXM4-80GB") == 8 and "00000000:BD:00.0" in out


def test_concurrent_settings_are_not_lost(host):
    h = host()
    env = h.env
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), "-i", str(i), "-pl", str(200 + i)], env=env,
                              stdout=subprocess.DEVNULL) for i in range(8)]
    assert [p.wait(timeout=10) for p in procs] == [0] * 8
    assert [r[0] for r in h.csv("power.limit")] == ["%d.00" % (200 + i) for i in range(8)]


def test_non_writable_run_dir(host):
    h = host()
    h.ok("-pm", "1")
    os.chmod(h.run_dir / "state.lock", 0o444)
    os.chmod(h.run_dir, 0o555)
    try:
        if os.access(h.run_dir / "state.lock", os.W_OK):
            pytest.skip("running as root")
        assert h.csv("persistence_mode", "-i", "0") == [["Enabled"]]    # reads still work
        rc, out = h.smi("-pl", "300")
        assert rc == 4 and "Insufficient Permissions" in out
    finally:
        os.chmod(h.run_dir, 0o755)
