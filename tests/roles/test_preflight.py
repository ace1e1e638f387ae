"""Preflight on lab hosts: each of the 14 refusals triggered on a simulated host of the profile
it concerns, its one-line message checked, the other hosts going on, and the refused host shown
unchanged afterwards. Plus the plan a healthy lab prints, and --dry against deploy.py.

Hosts: the session lab's a100 hosts (lab1, lab2), and this module adds an h100, a cmp170hx and a
GPU-less host next to them (removed at the end). Each pyinfra run takes about a second.
"""

import contextlib
import json
import re

import pytest

from tests.conftest import LAB_HOSTS, on_host
from tests.converge import pyinfra

pytestmark = pytest.mark.lab

EXTRA = ("h100", "cmp170hx", "none")
REV = "0123456789abcdef0123456789abcdef01234567"
GLM = {"repo": "unsloth/GLM-5.3-Flash-GGUF", "revision": REV, "include": ["UD-Q4_K_XL/*"], "size_gib": 186}
PLAN_KEYS = ("cards", "archs", "toolkit", "vram", "engines", "warning")


@pytest.fixture(scope="module")
def hosts(lab):
    """{profile: host name}: the session lab's first a100 host plus one host of each other profile."""
    names = {"a100": "lab1", "a100-2": "lab2"}
    for i, profile in enumerate(EXTRA, LAB_HOSTS + 1):
        lab.up(1, profile, first=i)
        names[profile] = f"lab{i}"
    try:
        yield names
    finally:
        for profile in EXTRA:
            lab.remove(names[profile])


# what an enabled cmpunlocker needs pinned (its role refuses it unpinned)
UNLOCKER = {"cmpunlocker_source": "https://example.invalid/cmpunlocker.git", "cmpunlocker_version": "0" * 40}


def preflight(*args: str):
    return pyinfra("inventory/lab.py", "preflight.py", *args, timeout=300)


def data(**values) -> list[str]:
    """--data arguments, values as JSON (so that "12.8" stays a string). Models given without
    instances replace the lab's serving instances too (group_vars/lab.yml's serve its model)."""
    if "models" in values:
        values.setdefault("llama_server_instances", {})
    out = []
    for key, value in values.items():
        out += ["--data", f"{key}={json.dumps(value)}"]
    return out


def refusal_lines(output: str, name: str) -> list[str]:
    return [ln.strip() for ln in output.splitlines() if ln.strip().startswith(f"[{name}] refused: ")]


def plan_lines(output: str) -> list[str]:
    keys = "|".join(PLAN_KEYS)
    return sorted(ln.strip() for ln in output.splitlines() if re.match(rf"\s+\[lab\d+\] ({keys}):", ln))


def assert_refused(run, refused: dict[str, list[str]], went_on: list[str]):
    """``run`` ended non-zero; each host of ``refused`` has exactly one line per expected text (one
    line each, naming host, what, why and fix); the hosts of ``went_on`` printed their plan and were
    not refused; the last line names every refused host."""
    assert run.returncode != 0, run.output[-3000:]
    for name, texts in refused.items():
        lines = refusal_lines(run.output, name)
        assert len(lines) == len(texts), (name, lines)
        for text in texts:
            assert any(text in ln for ln in lines), (name, text, lines)
        assert all("; fix: " in ln for ln in lines), lines
    for name in went_on:
        assert f"[{name}] cards:" in run.output, run.output[-3000:]
        assert refusal_lines(run.output, name) == []
    summary = re.search(r"preflight refused (\d+) host\(s\): (.*)", run.output)
    assert summary, run.output[-3000:]
    assert int(summary.group(1)) == len(refused)
    for name in refused:
        assert f"{name} (" in summary.group(2)
    for name in went_on:
        assert f"{name} (" not in summary.group(2)


SNAPSHOT = ("(nvidia-smi --query-gpu=index,power.limit,persistence_mode --format=csv,noheader || true) 2>&1; "
            "ls -la --full-time /opt/rigup /srv 2>&1 || true; "
            "find /etc /opt /srv /usr /var/lib /root -xdev -newer /run/rigup-preflight-mark "
            "-not -path '/var/lib/systemd/*' -not -path '/var/lib/prometheus/*' 2>/dev/null || true")
# /var/lib/prometheus: the time series a running Prometheus (tests/roles/test_metrics.py's monitoring
# host) writes on its own, whatever preflight does


@contextlib.contextmanager
def unchanged(lab, *names: str):
    """Assert that nothing on hosts ``names`` changed inside the block: power limits, persistence,
    /opt/rigup and /srv, and no file under /etc, /opt, /srv, /usr, /var/lib or /root newer than a
    mark set before it."""
    before = {}
    for name in names:     # (one SSH session each: the mark, then the snapshot)
        before[name] = on_host(lab, name, f"touch /run/rigup-preflight-mark && sleep 0.01 && {{ {SNAPSHOT}; }}")
    yield
    for name in names:
        after = on_host(lab, name, SNAPSHOT)
        assert after == before[name], f"{name} changed:\n--- before\n{before[name]}\n--- after\n{after}"


# ----------------------------------------------------------------------------- healthy lab
def test_healthy_lab_prints_each_hosts_plan(lab, hosts):
    with unchanged(lab, *hosts.values()):
        run = preflight()
    assert run.returncode == 0, run.output[-3000:]
    out = run.output
    for name in (hosts["a100"], hosts["a100-2"]):
        assert f"[{name}] cards:     8 x a100" in out
        assert f"[{name}] archs:     80" in out
        assert f"[{name}] toolkit:   CUDA >= 11.0" in out
        assert f"[{name}] vram:      8 x 81920 MiB = 655360 MiB" in out
        assert f"[{name}] engines:   llama.cpp yes (cuda); vllm no: " in out
    h100 = hosts["h100"]
    assert f"[{h100}] cards:     4 x h100" in out and f"[{h100}] archs:     90" in out
    assert f"[{h100}] toolkit:   CUDA >= 11.8" in out and f"[{h100}] engines:   llama.cpp yes (cuda); vllm yes" in out
    cmp = hosts["cmp170hx"]
    assert f"[{cmp}] vram:      6 x 8192 MiB = 49152 MiB (locked; 6 x 65536 MiB = 393216 MiB after unlock)" in out
    assert f"[{hosts['none']}] cards:     none (CPU only: " in out
    assert f"[{hosts['none']}] engines:   llama.cpp yes (cpu)" in out
    assert "refused" not in out


def test_dry_preflight_and_deploy_print_the_same_plan(lab, hosts):
    pre = preflight("--dry")
    dep = pyinfra("inventory/lab.py", "deploy.py", "--dry", timeout=600)
    assert pre.returncode == 0 and dep.returncode == 0, (pre.output[-2000:], dep.output[-2000:])
    assert len(plan_lines(pre.output)) >= 5 * 4
    assert plan_lines(pre.output) == plan_lines(dep.output)


# ----------------------------------------------------------------------------- 1, 2
def test_1_power_limit_outside_the_cards_range(lab, hosts):
    a100, cmp = hosts["a100"], hosts["cmp170hx"]
    with unchanged(lab, a100, cmp):
        run = preflight(*data(gpu_power_watts=450))
    fix = "(nvidia-smi power.min_limit..power.max_limit); fix: set gpu_power_watts between 100 and {}, or null"
    assert_refused(run, {
        a100: [f"[{a100}] refused: gpu_power_watts 450 W is outside the power range of this host's cards: "
               "GPU 0-7 (a100) accept 100-400 W " + fix.format(400)],
        hosts["a100-2"]: ["GPU 0-7 (a100) accept 100-400 W"],
        cmp: [f"[{cmp}] refused: gpu_power_watts 450 W is outside the power range of this host's cards: "
              "GPU 0-5 (cmp170hx) accept 100-250 W " + fix.format(250)],
    }, went_on=[hosts["h100"], hosts["none"]])  # H100: 200-700 W; the GPU-less host has no GPU roles


def test_2_override_naming_cards_not_on_the_host_and_1_an_override_out_of_range(lab, hosts):
    a100 = hosts["a100"]
    uuids = on_host(lab, a100, "nvidia-smi --query-gpu=uuid --format=csv,noheader").split()
    overrides = {"GPU-00000000-dead-beef-0000-000000000000": 300, "0000:c3:00.0": 200, uuids[3]: 450}
    with unchanged(lab, a100):
        run = preflight("--limit", a100, *data(gpu_power_overrides=overrides))
    assert_refused(run, {a100: [
        "gpu_power_overrides.GPU-00000000-dead-beef-0000-000000000000 names a card that is not on this host: "
        "no GPU here has that UUID or PCI bus id (its 8 GPUs: 00000000:07:00.0,",
        "gpu_power_overrides.0000:c3:00.0 names a card that is not on this host",
        f"gpu_power_overrides.{uuids[3]} 450 W is outside its card's power range: GPU 3 (a100, "
        "00000000:4E:00.0) accepts 100-400 W; fix: set it between 100 and 400",
    ]}, went_on=[])


# ----------------------------------------------------------------------------- 3
def test_3_gpu_roles_on_a_host_without_gpu(lab, hosts):
    none = hosts["none"]
    with unchanged(lab, none):
        run = preflight("--limit", none, "--limit", hosts["h100"], *data(gpu_enabled=True))
    assert_refused(run, {none: [
        f"[{none}] refused: GPU roles enabled on a host without a usable NVIDIA GPU: no NVIDIA GPU answers: "
        "nvidia-smi is missing or the driver is not loaded; fix: install the NVIDIA driver, or set "
        "gpu_enabled: false for this host"]}, went_on=[hosts["h100"]])


# ----------------------------------------------------------------------------- 4, 5
def test_4_driver_older_than_the_cuda_toolkit_needs(lab, hosts):
    a100, h100, cmp = hosts["a100"], hosts["h100"], hosts["cmp170hx"]
    with unchanged(lab, a100, h100):    # a CUDA build: the toolkit is installed for that alone
        run = preflight(*data(cuda_version="13.1", llama_cpp_backend="cuda"))
    line = ("refused: NVIDIA driver 580.105.08 is too old for CUDA 13.1: CUDA 13.1 needs driver >= 590.44.01 "
            "(CUDA release notes; rigup/gpu/catalogue.yml cuda_min_driver); driver 580.105.08 runs CUDA up to "
            "13.0; fix: set cuda_version to 13.0 or older (the newest this driver runs), or upgrade the NVIDIA "
            "driver to >= 590.44.01")
    assert_refused(run, {a100: [line], hosts["a100-2"]: [line], h100: [line]},
                   went_on=[cmp, hosts["none"]])  # the CMP host runs driver 610.43.02


def test_5_cuda_toolkit_too_old_for_the_hosts_archs(lab, hosts):
    h100 = hosts["h100"]
    with unchanged(lab, h100):
        run = preflight(*data(cuda_version="11.4"))
    assert_refused(run, {h100: [
        f"[{h100}] refused: CUDA 11.4 is too old for this host's cards: h100 cards (sm_90) need CUDA >= 11.8: "
        "nvcc 11.4 cannot build for them (rigup/gpu/catalogue.yml min_cuda); fix: set cuda_version to 11.8 or newer"]},
        went_on=[hosts["a100"], hosts["a100-2"], hosts["cmp170hx"], hosts["none"]])


# ----------------------------------------------------------------------------- 6
def test_6_serving_port_taken_names_the_process_and_our_own_server_is_not_refused(lab, hosts):
    h100 = hosts["h100"]
    listeners = on_host(lab, h100, "systemd-run --unit=fake-webui python3 -m http.server 8080 >/dev/null 2>&1; "
                       "ln -sf /usr/bin/python3 /usr/local/bin/llama-server && "
                       "systemd-run --unit=fake-llama /usr/local/bin/llama-server -m http.server 8082 >/dev/null 2>&1; "
                       "for i in $(seq 50); do ss -Hltn | grep -q ':8082 ' && ss -Hltn | grep -q ':8080 ' && break; "
                       "sleep 0.1; done; ss -Hltnp")
    try:
        assert re.search(r':8080 .*"python3"', listeners) and re.search(r':8082 .*"llama-server"', listeners), listeners
        instances = {"webui": {"model": "glm", "port": 8080}, "ours": {"model": "glm", "port": 8082}}
        with unchanged(lab, h100):
            run = preflight("--limit", h100, *data(models={"glm": dict(GLM, size_gib=1)},
                                                   llama_server_instances=instances))
        assert_refused(run, {h100: [
            f"[{h100}] refused: port 8080 of llama_server_instances.webui is already taken: process python3 listens "
            "on it (ss -ltnp 'sport = :8080'), so the server could not bind; fix: stop python3 or give the "
            "instance another port (llama_server_instances.webui.port: 8081 is free)"]}, went_on=[])
    finally:
        on_host(lab, h100, "systemctl stop fake-webui fake-llama; rm -f /usr/local/bin/llama-server")


def test_6_a_listener_is_found_on_a_host_without_ss(lab, hosts):
    """As on many rental containers (and the lent H200 machine): no ss. The ports come from
    /proc/net/tcp, without process names, and a taken port is still refused, naming it."""
    h100 = hosts["h100"]
    on_host(lab, h100, "mv /usr/bin/ss /usr/bin/ss.away; systemd-run --unit=fake-webui python3 -m http.server 8080 "
                       ">/dev/null 2>&1; for i in $(seq 50); do grep -q ':1F90 00000000:0000 0A' /proc/net/tcp* && break; "
                       "sleep 0.1; done")
    try:
        with unchanged(lab, h100):
            run = preflight("--limit", h100, *data(models={"glm": dict(GLM, size_gib=1)},
                                                   llama_server_instances={"webui": {"model": "glm", "port": 8080}}))
        assert_refused(run, {h100: [
            f"[{h100}] refused: port 8080 of llama_server_instances.webui is already taken: a process that cannot be "
            "named here (no ss, or not root) listens on it"]}, went_on=[])
        print("without ss: port 8080 refused from /proc/net/tcp")
    finally:
        on_host(lab, h100, "systemctl stop fake-webui; mv /usr/bin/ss.away /usr/bin/ss")


# ----------------------------------------------------------------------------- 7, 8
def test_7_not_enough_free_disk_gives_both_sizes(lab, hosts):
    a100 = hosts["a100"]
    with unchanged(lab, a100):
        run = preflight("--limit", a100, *data(models={"glm": dict(GLM, size_gib=100000)}))
    assert_refused(run, {a100: ["refused: not enough free disk for model glm: it needs 100000.0 GiB more at "
                                "/srv/models/glm (100000.0 GiB in all, 0.0 GiB already there) and that filesystem has "]},
                   went_on=[])
    free = re.search(r"filesystem has ([\d.]+) GiB free; fix: free ([\d.]+) GiB there", run.output)
    assert free and abs(float(free.group(1)) + float(free.group(2)) - 100000) < 0.2


def test_8_model_plus_kv_cache_beyond_the_vram_gives_the_figures(lab, hosts):
    h100 = hosts["h100"]
    instances = {"glm": {"model": "glm", "port": 8081, "ctx": 5_000_000, "parallel": 8}}
    with unchanged(lab, h100):
        run = preflight("--limit", h100, *data(models={"glm": dict(GLM, size_gib=186)},
                                               llama_server_instances=instances))
    lines = refusal_lines(run.output, h100)
    vram = [ln for ln in lines if "does not fit the VRAM" in ln]
    assert vram == [
        f"[{h100}] refused: model glm does not fit the VRAM of llama_server_instances.glm: weights 186.0 GiB + "
        "KV cache 150.0 GiB (5,000,000 tokens x 0.03 GiB per 1k, glm-5.3-flash estimate from rigup/gpu/models.yml) "
        "+ 4.0 GiB overhead (1 GiB per GPU) = 340.0 GiB > 318.6 GiB of VRAM (4 x 79.6 GiB); fix: lower "
        "llama_server_instances.glm.ctx, pick a smaller quant, give each replica more GPUs (gpus_per_replica: auto), "
        "or lower ngl to keep layers on the CPU"]
    assert run.returncode != 0
    assert all("not enough free disk" in ln for ln in lines if ln not in vram)  # this machine's disk may be small


def test_an_instance_without_ctx_or_parallel_gets_slots_from_the_vram_and_the_plan_says_why(lab, hosts):
    """An 8x A100 host (the lab's stand-in cards, a CUDA build), a GLM instance that sets neither
    ctx nor parallel: more than one slot of at least 8,192 tokens, within the VRAM check."""
    a100 = hosts["a100"]
    with unchanged(lab, a100):
        run = preflight("--limit", a100, *data(models={"glm": dict(GLM, size_gib=4)}, llama_cpp_backend="cuda",
                                               llama_server_instances={"glm": {"model": "glm", "port": 8081}}))
    said = [ln.strip() for ln in run.output.splitlines() if f"[{a100}] llama:" in ln]
    print("\n" + "\n".join(said))
    assert run.returncode == 0 and refusal_lines(run.output, a100) == [], run.output[-3000:]
    chosen = [ln for ln in said if "glm: ctx " in ln]
    slots = re.search(r"glm: ctx ([\d,]+) = (\d+) slots x ([\d,]+) tokens: .+ GiB of VRAM left after the weights", chosen[0])
    assert slots and int(slots.group(2)) > 1 and int(slots.group(3).replace(",", "")) >= 8192, chosen


def test_a_card_at_x4_of_x16_is_flagged_and_is_not_the_main_gpu(lab, hosts):
    """GPU 0 of the 8x A100 host negotiates x4 (the stand-in's ``sim set --pcie-width 4``, as a
    riser would): the plan warns and names it, and the instance over every GPU gets another card
    as its main GPU (GPU 0 listed last)."""
    a100 = hosts["a100"]
    on_host(lab, a100, "nvidia-smi sim set -i 0 --pcie-width 4")
    try:
        with unchanged(lab, a100):
            run = preflight("--limit", a100, *data(models={"glm": dict(GLM, size_gib=4)}, llama_cpp_backend="cuda",
                                                   llama_server_instances={"glm": {"model": "glm", "port": 8081}}))
    finally:
        on_host(lab, a100, "nvidia-smi sim set -i 0 --pcie-width 16")
    said = [ln.strip() for ln in run.output.splitlines() if "DOWNTRAINED" in ln or "main GPU" in ln]
    print("\n" + "\n".join(said))
    assert run.returncode == 0, run.output[-3000:]
    assert any("GPU 0 (00000000:07:00.0): PCIe x4 of x16 DOWNTRAINED" in ln for ln in said), said
    assert any("glm: main GPU 1 (its first visible device); GPU 0 (x4 of x16) last" in ln for ln in said), said


# ----------------------------------------------------------------------------- 9, 10
def test_9_vllm_recipe_needing_hopper_on_ampere(lab, hosts):
    a100, h100 = hosts["a100"], hosts["h100"]
    models = {"glm": dict(GLM, repo="zai-org/GLM-5.3-Flash", include=[], size_gib=1)}
    with unchanged(lab, a100, h100):
        run = preflight("--limit", a100, "--limit", h100,
                        *data(models=models, vllm_pip_version="0.33.0",
                               vllm_instances={"glm": {"model": "glm", "port": 8000, "tp": 4}}))
    assert_refused(run, {a100: [
        f"[{a100}] refused: vllm_instances.glm needs compute capability >= 9.0 for GLM-5.3 Flash (Z.ai, 321B MoE, "
        "18B active, sparse MLA): stock vLLM's kernels for glm-5.3-flash run only on cc >= 9.0 (rigup/gpu/models.yml, "
        "from 000_5bdf47c995ca0741.txt, 001_62f01b4e828dcb29.txt); this host's a100 cards are cc 8.0; fix: serve it "
        "with llama.cpp on this host (llama_server_instances), run vLLM on Hopper or newer"]},
        went_on=[h100])


def test_10_split_mode_row_for_glm(lab, hosts):
    h100 = hosts["h100"]
    instances = {"glm": {"model": "glm", "port": 8081, "split_mode": "row"}}
    with unchanged(lab, h100):
        run = preflight("--limit", h100, *data(models={"glm": dict(GLM, size_gib=1)}, llama_server_instances=instances))
    assert_refused(run, {h100: [
        f"[{h100}] refused: llama_server_instances.glm uses -sm row for GLM-5.3 Flash (Z.ai, 321B MoE, 18B active, "
        "sparse MLA): llama.cpp fails to load glm-5.3-flash with row split: \"device CUDA0 does not support split "
        "buffers\" (rigup/gpu/models.yml, from 000_5bdf47c995ca0741.txt, 001_62f01b4e828dcb29.txt); fix: set "
        "llama_server_instances.glm.split_mode: layer"]}, went_on=[])


# ----------------------------------------------------------------------------- 11-14
def test_11_to_14_cmpunlocker_prerequisites(lab, hosts):
    a100, cmp = hosts["a100"], hosts["cmp170hx"]
    no_headers = "refused: cmpunlocker without kernel headers: it builds patched nvidia modules against the running kernel "
    # 12 on both hosts (lab hosts have no /lib/modules/$(uname -r)/build); 13 and 14 on the A100 host
    with unchanged(lab, a100, cmp):
        run = preflight("--limit", a100, "--limit", cmp, *data(**UNLOCKER, cmpunlocker_enabled=True))
    assert_refused(run, {
        a100: [no_headers,
               f"[{a100}] refused: cmpunlocker on NVIDIA driver 580.105.08: its patches apply to exactly 610.43.02, "
               "610.43.03 (cmpunlocker_supported_drivers, from its driver/VERSION; there is no range); fix: install "
               "one of them (e.g. apt-get install nvidia-driver-610-open) and reboot",
               f"[{a100}] refused: cmpunlocker on cards that are not CMP 170HX: GPU 0-7 are 10de:20b2 (a100-sxm4-80gb); "
               "cmpunlocker unlocks only 10de:2082 (10gb), 10de:20c2 (8gb) cards, found by PCI id; fix: set "
               "cmpunlocker_enabled: false for this host"],
        cmp: [no_headers]}, went_on=[])
    assert "/build is missing; fix: install them (apt-get install linux-headers-" in run.output

    release = on_host(lab, cmp, "uname -r").strip()
    on_host(lab, cmp, f"mkdir -p /lib/modules/{release}/build && "
                      "printf '#!/bin/sh\\necho SecureBoot enabled\\n' > /usr/local/bin/mokutil && "
                      "chmod +x /usr/local/bin/mokutil")
    try:
        with unchanged(lab, cmp):
            run = preflight("--limit", cmp, *data(**UNLOCKER, cmpunlocker_enabled=True))           # 11
        assert_refused(run, {cmp: [
            f"[{cmp}] refused: cmpunlocker with Secure Boot on: its patched NVIDIA kernel modules are unsigned, so "
            "the kernel would not load them (its installer aborts; mokutil --sb-state says SecureBoot enabled); fix: "
            "turn Secure Boot off in the firmware setup, or set cmpunlocker_enabled: false for this host"]}, went_on=[])

        on_host(lab, cmp, "rm /usr/local/bin/mokutil")
        with unchanged(lab, cmp):
            run = preflight("--limit", cmp, *data(**UNLOCKER, cmpunlocker_enabled=True,                # 13
                                                  cmpunlocker_supported_drivers=["610.57.04"]))
        assert_refused(run, {cmp: [f"[{cmp}] refused: cmpunlocker on NVIDIA driver 610.43.02: its patches apply "
                                   "to exactly 610.57.04"]}, went_on=[])

        run = preflight("--limit", cmp, *data(**UNLOCKER, cmpunlocker_enabled=True, gpu_power_watts=180))  # all met
        assert run.returncode == 0 and refusal_lines(run.output, cmp) == [], run.output[-2000:]
    finally:
        on_host(lab, cmp, f"rm -rf /lib/modules/{release}/build /usr/local/bin/mokutil")


# ----------------------------------------------------------------------------- nested maps
def test_instance_naming_an_unknown_model_is_refused_by_key_path(lab, hosts):
    h100 = hosts["h100"]
    instances = {"glm": {"model": "glm53", "port": 8081, "ctx": "big"}}
    run = preflight("--limit", h100, *data(models={"glm": dict(GLM, size_gib=1)}, llama_server_instances=instances))
    assert_refused(run, {h100: [
        f"[{h100}] refused: llama_server_instances.glm.model (--data): 'glm53' is not a key of models (its keys: glm; "
        "did you mean 'glm'?)",
        f"[{h100}] refused: llama_server_instances.glm.ctx (--data): expected count 1..16777216, got 'big' (str): auto (rigup chooses) or an int >= 1"]}, went_on=[])
