"""roles/model_fetch under faults made for real on the lab, with the play and helpers of
test_model_fetch.py: a clean reboot mid-download, a kill -9, a connection the hub cuts mid-file,
a filesystem that fills up mid-download, a hub that lists paths outside the model's directory,
and each answer of the lab hub's hostile mode (tests/lab/hub.py: a bad commit, a name with a
newline, a duplicate path, a gzip bomb, a next page on another origin, Range ignored, a trickle),
and the hub itself stopped (its port refusing): at a converge that needs it (refused at preflight)
and under a running download (retried within the job, named by status.py, completed once it is back).

Bytes are counted by the lab hub (tests/lab/hub.py), per lab host; each test prints its figures.
"""

import base64
import json
import re
import time

import pytest

from rigup.names import HF_TOKEN, MARKER
from roles.model_fetch.shipped import fetcher
from tests.conftest import on_host
from tests.converge import ROOT, pyinfra
from tests.roles.test_model_fetch import BIG, converge, marker, model, progress, wait_for
from tests.roles.test_model_fetch import hub, play  # noqa: F401 (fixtures)

pytestmark = pytest.mark.lab
DEST = "/srv/models/big"
UNIT = "rigup-fetch-big"
MID = 64 << 20
FULL = "/mnt/full"   # a small tmpfs on the lab host, filled for real


def big(revs, **kw):
    return {"models": {"big": model(revs, "big", include=["big.bin"], **kw)}, "model_fetch_wait_interval": 1}


def started(lab, hub_module, name, bps):
    """No big.bin on ``name`` yet, the hub's counters at zero and its streams at ``bps``."""
    on_host(lab, name, f"rm -rf {DEST}")
    hub_module.reset()
    hub_module.rate(bps)


def report(what, served, size):
    print(f"\n{what}: the hub sent {served} bytes for a {size}-byte model: {served / size:.4f}x")
    return served / size


def test_clean_reboot_mid_download_fetches_nothing_again(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    started(lab, hub_module, name, 40 << 20)
    try:
        converge(play, tmp_path, {name: big(revs)})
        wait_for(lambda: progress(lab, name, DEST).get("bytes", 0) >= BIG * 0.4, 120, "40% of the file")
        lab.reboot(name)  # systemd stops the job with SIGTERM: it checkpoints every byte it has
    finally:
        hub_module.rate(0)
    part = int(on_host(lab, name, f"stat -c %s {DEST}/.rigup-fetch/parts/big.bin"))
    ckpt = json.loads(on_host(lab, name, f"cat {DEST}/.rigup-fetch/ckpt/big.bin"))
    stopped = progress(lab, name, DEST)
    assert stopped["state"] == "stopped" and "SIGTERM" in stopped["detail"], stopped
    assert ckpt["bytes"] == part and 0 < part < BIG
    # What the hub wrote before the stop but the job never read sat in the two TCP buffers
    # (Linux autotunes them to several MiB each): sent once, never kept, so not a refetch.
    in_flight = hub_module.bytes_served(h["address"]) - part
    hub_module.reset()
    run = converge(play, tmp_path, {name: big(revs, wait=True)})
    assert "stopped at" in run.output and marker(lab, name, DEST)["bytes"] == BIG
    after = hub_module.bytes_served(h["address"])
    print(f"\nreboot at {100 * part / BIG:.0f}%: {part} bytes kept, checkpointed before the reboot; "
          f"{in_flight} bytes were in flight at the stop; after it the hub sent {after} bytes "
          f"for the {BIG - part} missing")
    assert 0 <= in_flight <= 16 << 20
    assert report("clean reboot mid-download, after the reboot", after, BIG - part) <= 1.01


def test_kill_9_then_converge(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    started(lab, hub_module, name, 40 << 20)
    try:
        converge(play, tmp_path, {name: big(revs)})
        wait_for(lambda: progress(lab, name, DEST).get("bytes", 0) >= BIG * 0.4, 120, "40% of the file")
        unit = on_host(lab, name, f"systemctl show -p Restart,RestartUSec,RestartPreventExitStatus {UNIT}")
        assert "Restart=on-failure" in unit and "RestartUSec=30s" in unit, unit
        on_host(lab, name, f"systemctl kill -s KILL {UNIT}; while [ \"$(systemctl show -p MainPID --value {UNIT})\" "
                           "!= 0 ]; do sleep 0.1; done")
    finally:
        hub_module.rate(0)
    part = int(on_host(lab, name, f"stat -c %s {DEST}/.rigup-fetch/parts/big.bin"))
    converge(play, tmp_path, {name: big(revs, wait=True)})
    assert marker(lab, name, DEST)["bytes"] == BIG
    print(f"\nkill -9 at {100 * part / BIG:.0f}%")
    assert report("kill -9 then converge", hub_module.bytes_served(h["address"]), BIG) <= 1.05


def test_a_connection_cut_mid_file_is_resumed_in_the_same_job(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    started(lab, hub_module, name, 64 << 20)
    hub_module.cut(96 << 20, times=1, how="close")
    try:
        converge(play, tmp_path, {name: big(revs)})
        pid = wait_for(lambda: progress(lab, name, DEST).get("pid"), 60, "the job to start")
        hub_module.rate(0)   # the job seen: the cut (at its byte count) and the resume need no slow link
        got = wait_for(lambda: marker(lab, name, DEST), 120, "the marker")
    finally:
        hub_module.rate(0)
    done = progress(lab, name, DEST)
    restarts = on_host(lab, name, f"systemctl show -p NRestarts --value {UNIT} 2>/dev/null || true").strip()
    print(f"\ncut at 96 MiB: pid {pid} before, {done['pid']} at the end, {done['resumes']} resume(s) in the job, "
          f"systemd restarts: {restarts or 'none (unit collected)'}")
    assert got["bytes"] == BIG and done["state"] == "complete"
    assert done["pid"] == pid and done["resumes"] == 1
    assert report("connection cut mid-file", hub_module.bytes_served(h["address"]), BIG) <= 1.05


def status(tmp_path, name):
    inventory = sorted(tmp_path.glob("inventory_*.py"))[-1]
    return pyinfra(str(inventory), str(ROOT / "status.py"), "--limit", name)


def test_disk_full_mid_download_says_why_and_completes_once_freed(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name, dest = h["name"], f"{FULL}/mid"
    config = hub_module.CACHE / "tiny-config.json"
    rev = hub_module.publish("lab/mid", {"mid.bin": hub_module.random_file("mid-64m.bin", MID), "config.json": config})
    on_host(lab, name, f"mkdir -p {FULL} && (mountpoint -q {FULL} && umount {FULL}; true) && "
                       f"mount -t tmpfs -o size=80m,mode=755 tmpfs {FULL}")
    data = {name: {"models": {"mid": {"repo": "lab/mid", "revision": rev, "include": ["mid.bin"], "dest": dest,
                                      "wait": True}}, "model_fetch_wait_interval": 1}}
    hub_module.reset()
    hub_module.rate(16 << 20)
    try:
        waiting = converge(play, tmp_path, data, popen=True)
        wait_for(lambda: progress(lab, name, dest).get("bytes", 0) >= 8 << 20, 120, "8 MiB of the file")
        # the rest of the filesystem taken by another writer, for real
        on_host(lab, name, f"fallocate -l $(( $(df --output=avail -B1 {FULL} | tail -1) - (2 << 20) )) {FULL}/filler")
        filled = time.monotonic()
        out, _ = waiting.communicate(timeout=120)
        failed_after = time.monotonic() - filled
    finally:
        hub_module.rate(0)
    assert waiting.returncode != 0
    assert f"model mid: the download failed: no space left on device at {dest}, " in out, out[-3000:]
    print(f"\ndisk full: the converge waiting on it failed {failed_after:.1f} s after the disk filled")
    shown = status(tmp_path, name)
    line = next(ln for ln in shown.output.splitlines() if "mid failed:" in ln)
    print(f"status.py: {line.strip()}")
    assert f"mid failed: no space left on device at {dest}, " in line and "more needed" in line
    assert on_host(lab, name, f"find {FULL} -name '*.tmp*'") == ""  # no temp file left behind
    assert on_host(lab, name, "systemctl is-active rigup-fetch-mid || true").strip() != "active"  # no restart
    on_host(lab, name, f"rm {FULL}/filler")
    converge(play, tmp_path, data)
    assert marker(lab, name, dest)["bytes"] == MID
    report("disk full, then freed and converged", hub_module.bytes_served(h["address"]), MID)
    on_host(lab, name, f"umount {FULL}")


HOSTILE = ["../../x", "/etc/cron.d/x", "a/../../x"]


def test_a_hostile_listing_is_refused_and_nothing_outside_dest_is_touched(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name, dest = h["name"], "/srv/models/evil"
    config = hub_module.CACHE / "tiny-config.json"
    rev = hub_module.publish("lab/evil", {"config.json": config})
    hub_module.reset()
    hub_module.hostile("lab/evil", HOSTILE)
    # what those paths reach from dest, kept with a wrong size: a fetcher would "repair" them
    sentinels = ["/srv/x", "/srv/models/x"]
    on_host(lab, name, f"rm -rf {dest} /etc/cron.d/x; mkdir -p /srv/models; "
                       + "; ".join(f"echo keep > {s}" for s in sentinels))
    listed = [f["path"] for f in fetcher.hub_files(hub_module.url(), "lab/evil", rev, None)]
    assert set(HOSTILE) <= set(listed)  # the hub does list them
    # size and family given: the controller asks the hub nothing (the hostile mode's cases below
    # are refused there); the host's own probe of the listing is what the plan refuses here
    models = {"evil": {"repo": "lab/evil", "revision": rev, "dest": dest, "size_gib": 0.001, "family": "glm-5.3-flash"}}
    run = converge(play, tmp_path, {name: {"models": models}}, check=False)
    assert run.returncode != 0
    refused = [ln.strip() for ln in run.output.splitlines() if "refused: models.evil.repo" in ln]
    print("\n" + "\n".join(refused))
    for path in HOSTILE:
        assert any(f" lists {path!r}" in ln for ln in refused), path
    assert hub_module.bytes_served(h["address"]) == 0
    assert lab.ssh(name, f"test -e {dest}").returncode != 0

    # defence in depth: the fetcher itself, run as root on a job.json made by hand with those paths
    files = fetcher.hub_files(hub_module.url(), "lab/evil", rev, None)
    job = {"dest": dest, "repo": "lab/evil", "revision": rev, "source": hub_module.url(), "files": files,
           "include": [], "workers": 2, "marker": MARKER, "token_file": HF_TOKEN}
    script = fetcher.__file__
    result = lab.ssh(name, f"mkdir -p {dest}/.rigup-fetch && cat > {dest}/.rigup-fetch/job.json <<'RIGUP_EOF'\n"
                           f"{json.dumps(job)}\nRIGUP_EOF\ncat > /tmp/rigup-fetch.py <<'RIGUP_EOF'\n"
                           f"{open(script).read()}\nRIGUP_EOF\n"
                           f"python3 /tmp/rigup-fetch.py fetch {dest}/.rigup-fetch/job.json")
    assert result.returncode == fetcher.PERMANENT, result.stdout + result.stderr
    error = progress(lab, name, dest)["error"]
    print(f"fetcher on a hand-made job: exit {result.returncode}: {error}")
    assert error.startswith("refused: the hub listed '../../x'")
    for s in sentinels:
        assert on_host(lab, name, f"cat {s}") == "keep\n"
    assert lab.ssh(name, "test -e /etc/cron.d/x").returncode != 0
    assert on_host(lab, name, f"find {dest} -type f ! -path '*/.rigup-fetch/*'") == ""
    assert hub_module.bytes_served(h["address"]) == 0
    on_host(lab, name, f"rm -rf {dest} " + " ".join(sentinels))


# ------------------------------------------------------------------ the lab hub's hostile mode

HOSTILE_DEST = "/srv/models/hostile"
MARK = "/tmp/rigup-hostile-mark"
# what a converge may touch outside dest without writing: the kernel's and the run's own places,
# the lab's simulated nvidia-smi's log of its calls (tests/lab/nvidia_smi.py; preflight runs it),
# the node exporter's textfile directory, which the metric timers of a host converged by an
# earlier module (deploy.py's) rewrite every few seconds whatever the converge does, and the
# ccache, the machine's one shared cache bind-mounted into every lab host (tests/lab/lab.py
# CCACHE), which a build in the other lane's lab writes meanwhile (seen in a run from a new
# machine, where that build was cold)
NOT_WRITES = ("/proc", "/sys", "/dev", "/run", "/tmp", "/var/tmp", "/var/log", "/var/lib/rigup-gpu-sim/calls.log",
              "/var/lib/prometheus/node-exporter", "/var/cache/rigup/ccache")
NEWLINE = "a\nExecStartPre=+/bin/touch /pwned"
PLAN_S = 120          # a converge refused at plan time (seconds on a loaded 2-core machine)
TRICKLE_BPS, STALL_S, CUT_AT = 16, 1, 256 << 10
RETRIES = 2           # model_fetch_retries of the job cases (10 by default: the unit tests count those); 2
                      # shows the retries in a row as 3 did, a stalled stream and its backoff (2 s) sooner
JOB = {"include": ["*.gguf"], "size_gib": 0.01, "family": "glm-5.3-flash", "wait": True}


def job_bound(stall_s: float, retries: int) -> float:
    """The most a job may take to fail on a hub whose every stream stalls or is cut: ``retries``
    + 1 streams of a stall window (and a read) each, the backoffs between them at their longest,
    and the converge around it."""
    backoff = sum(min(fetcher.BACKOFF_MAX_S, fetcher.BACKOFF_S * 2 ** k) for k in range(retries))
    return (retries + 1) * (stall_s + 1) + backoff + PLAN_S


# case -> (hub switches, the model's entry beyond repo/revision/dest, host data, cut after, the
# reason's words, the bound in s). The plan-time cases leave size_gib and family out: the
# controller asks the hub (listing, header) and refuses there; the job cases give both, so the
# controller asks nothing and the job meets the hub.
HOSTILE_CASES = {
    "bad-commit": ({"commit": "0" * 40 + "\nExecStartPre=+/bin/touch /pwned"}, {"revision": "main"},
                   {"models_allow_unpinned": True}, None, "not 40 lowercase hex", PLAN_S),
    "newline-name": ({"paths": [NEWLINE]}, {}, {}, None, f"{NEWLINE!r}: a control character in the path", PLAN_S),
    "duplicate-path": ({"paths": ["config.json"]}, {}, {}, None, "'config.json': listed twice", PLAN_S),
    "duplicate-by-case": ({"paths": ["CONFIG.JSON"]}, {}, {}, None, "compared case-insensitively", PLAN_S),
    "gzip-listing": ({"gzip": ["listing"]}, {}, {}, None, "listing of lab/hostile with Content-Encoding 'gzip'", PLAN_S),
    "gzip-header": ({"gzip": ["resolve"]}, {}, {}, None, "answered with Content-Encoding 'gzip'", PLAN_S),
    "next-page-elsewhere": ({"next_page": "OTHER"}, {}, {}, None, "has its next page on another host: OTHER", PLAN_S),
    "range-ignored": ({"ignore_range": True}, JOB, {"model_fetch_retries": RETRIES}, CUT_AT,
                      f"the hub ignores Range (it answered 200, the whole file, to {RETRIES} requests",
                      job_bound(1, RETRIES)),
    "trickle": ({"trickle_bps": TRICKLE_BPS}, JOB, {"model_fetch_stall_timeout": STALL_S, "model_fetch_retries": RETRIES},
                None, f"per {STALL_S} s (stalled); {RETRIES} retries in a row failed", job_bound(STALL_S, RETRIES)),
}


@pytest.fixture(scope="module")
def hostile_repo(lab, hub, play, tmp_path_factory):
    """lab/hostile (a config and a one-shard GGUF of 2 MiB, in LFS) and its commit, fetched once
    to HOSTILE_DEST as the job cases declare it: base, rigup-fetch and /etc/rigup are then as those
    converges leave them, so that anything they write outside dest is the hub's doing."""
    hub_module, _ = hub
    files = {**hub_module.gguf_shards("hostile", 1), "config.json": hub_module.CACHE / "tiny-config.json"}
    rev = hub_module.publish("lab/hostile", files)
    name = lab.hosts()[0]["name"]
    hub_module.reset()
    model = {"repo": "lab/hostile", "revision": rev, "dest": HOSTILE_DEST, **JOB}
    run = converge(play, tmp_path_factory.mktemp("hostile"), {name: {"models": {"hostile": model},
                                                                     "model_fetch_wait_interval": 1}})
    print(f"\nlab/hostile fetched once to {HOSTILE_DEST} (the hub's good answers) in {run.seconds:.1f} s")
    return rev


def touched(lab, name: str) -> list[str]:
    """Paths of ``name`` written (mtime or ctime) since MARK, but dest and NOT_WRITES."""
    prune = " -o ".join(f"-path {p}" for p in (*NOT_WRITES, HOSTILE_DEST))
    out = on_host(lab, name, f"find / -xdev \\( {prune} \\) -prune -o \\( -newer {MARK} -o -cnewer {MARK} \\) -print")
    return sorted(out.split("\n")[:-1])


def units(lab, name: str) -> str:
    """Every line of rigup's units, drop-ins and /etc/rigup (as tests/roles/test_hostile.py reads them)."""
    return lab.ssh(name, "grep -r '' /etc/systemd/system/rigup-* /etc/rigup 2>/dev/null | sort").stdout


@pytest.mark.parametrize("case", list(HOSTILE_CASES))
def test_a_hostile_hub_answer_fails_in_bounded_time_naming_the_reason(lab, hub, play, hostile_repo, tmp_path, case):
    hub_module, _ = hub
    switches, entry, data, cut, words, bound = HOSTILE_CASES[case]
    h = lab.hosts()[0]
    name, endpoint = h["name"], hub_module.url()
    other = f"{hub_module.other_url()}/api/models/lab/hostile/tree/{hostile_repo}?cursor=2"
    switches = {k: other if v == "OTHER" else v for k, v in switches.items()}
    words = words.replace("OTHER", other)
    model = {"repo": "lab/hostile", "revision": hostile_repo, "dest": HOSTILE_DEST, **entry}
    on_host(lab, name, f"rm -rf {HOSTILE_DEST} /pwned; install -d -o rigup -g rigup {HOSTILE_DEST}")
    before = units(lab, name)
    on_host(lab, name, f"touch {MARK}")
    hub_module.reset()
    hub_module.hostile("lab/hostile", **switches)
    if cut:
        hub_module.cut(cut, times=0)
    try:
        run = converge(play, tmp_path, {name: {"models": {"hostile": model}, "model_fetch_wait_interval": 1, **data}},
                       check=False, env={"RIGUP_CACHE_DIR": str(tmp_path / "hub-cache")})
        asked, elsewhere = hub_module.requests(), hub_module.other_requests()
        served = hub_module.bytes_served(h["address"])
    finally:
        hub_module.reset()
        on_host(lab, name, "systemctl stop rigup-fetch-hostile 2>/dev/null; systemctl reset-failed rigup-fetch-hostile "
                           "2>/dev/null; true")
    assert run.returncode != 0, run.output[-3000:]
    lines = [ln.strip() for ln in run.output.splitlines()
             if "refused: models.hostile" in ln or "model hostile: the download failed" in ln]
    print(f"\n{case}: failed in {run.seconds:.1f} s (bound {bound:.0f} s); hub: {len(asked)} requests, "
          f"{sum(r['auth'] for r in asked)} with a token, {served} file bytes to the host; other origin: "
          f"{len(elsewhere)} requests")
    print("\n".join(lines))
    assert lines and words in lines[0] and endpoint in lines[0], run.output[-3000:]
    assert run.seconds < bound
    assert elsewhere == [] and not any(r["auth"] for r in asked)   # an http:// hub is never given a token
    if not cut and "trickle_bps" not in switches:
        assert "refused: models.hostile" in lines[0] and served == 0   # at plan time: no byte, no job
    else:
        fetched = sorted(hub_module.gguf_shards("hostile", 1))
        assert f"{fetched[0]}: " in lines[0]
    written, after = touched(lab, name), units(lab, name)
    gained = sorted(set(after.splitlines()) - set(before.splitlines()))
    print(f"written outside {HOSTILE_DEST}: {written or 'nothing'}; unit and /etc/rigup lines gained: {len(gained)}")
    assert written == [] and gained == [], (written, gained)
    assert "pwned" not in after and lab.ssh(name, "test -e /pwned").returncode != 0
    on_host(lab, name, f"rm -rf {HOSTILE_DEST} {MARK}")


TOKEN = "hf_lab_https_token_0123456789abcdef"
# the token as grep's pattern file, made without the token in any command line (a grep given it
# as an argument would find itself in /proc/*/cmdline)
PATTERN = f"echo {base64.b64encode(TOKEN.encode()).decode()} | base64 -d > /tmp/token"


def test_over_https_the_token_reaches_the_hubs_origin_only(lab, hub, play, hostile_repo, tmp_path):
    """The hub's https origin (the lab CA): the controller's HF_TOKEN goes to /etc/rigup/hf-token
    (root, 0600) and from there, as the job's credential, to the hub alone: never an argv, a unit,
    the journal, pyinfra's output or the model's files; a next page on another origin is not
    followed by the host's probe, which holds the token."""
    from tests.lab import tls

    hub_module, _ = hub
    h = lab.hosts()[0]
    name, endpoint = h["name"], hub_module.https_url()
    dest, unit = "/srv/models/secret", "rigup-fetch-secret"
    env = {"HF_TOKEN": TOKEN, "SSL_CERT_FILE": str(tls.controller_bundle()), "RIGUP_CACHE_DIR": str(tmp_path / "cache")}
    secure = {"hf_endpoint": endpoint, "hf_endpoint_insecure": False, "model_fetch_wait_interval": 1}
    # size and family left out: the controller lists the repo and reads the GGUF header, with the token
    model = {"repo": "lab/hostile", "revision": hostile_repo, "dest": dest, "include": ["*.gguf"], "wait": True}
    on_host(lab, name, f"rm -rf {dest} /etc/rigup/hf-token")
    hub_module.reset()
    hub_module.rate(256 << 10)   # 2 MiB: about 8 s of a job to look at
    try:
        waiting = converge(play, tmp_path, {name: {"models": {"secret": model}, **secure}}, popen=True, env=env)
        wait_for(lambda: progress(lab, name, dest).get("bytes", 0) > 0, 120, "the job's first bytes")
        argv = on_host(lab, name, f"{PATTERN}; grep -lFf /tmp/token /proc/[0-9]*/cmdline 2>/dev/null; true")
        shown = on_host(lab, name, f"systemctl show {unit} -p ExecStart -p Environment -p LoadCredential; "
                                   f"cat /run/systemd/transient/{unit}.service")
        hub_module.rate(0)   # looked at: the rest of the job at full speed
        out, _ = waiting.communicate(timeout=300)
    finally:
        hub_module.rate(0)
    assert waiting.returncode == 0, out[-3000:]
    assert marker(lab, name, dest)["files"] == sorted(hub_module.gguf_shards("hostile", 1))
    asked, tokens, elsewhere = hub_module.requests(), hub_module._call("/_lab/tokens"), hub_module.other_requests()
    on_disk = on_host(lab, name, "stat -c '%a %U' /etc/rigup/hf-token").strip()
    leaks = on_host(lab, name, f"{PATTERN}; grep -rlFf /tmp/token /etc/systemd /run/systemd /etc/rigup {dest} /opt/rigup "
                               "2>/dev/null | grep -vx /etc/rigup/hf-token; journalctl --no-pager -o cat | grep -cFf /tmp/token; "
                               "rm /tmp/token; true")
    print(f"\nover https: {len(asked)} requests to the hub, {sum(r['auth'] for r in asked)} with the token, "
          f"{sum(r['https'] for r in asked)} over https; tokens by client: { {k: len(v) for k, v in tokens.items()} }; "
          f"other origin: {len(elsewhere)} requests; /etc/rigup/hf-token {on_disk}; the unit's credential: "
          f"{'LoadCredential=hf-token:/etc/rigup/hf-token' in shown}")
    # every request over https, with the token, but the host's probe's listing: it runs before the
    # converge puts the token on the host (as the first converge of any host does)
    bare = [r for r in asked if not r["auth"]]
    print(f"requests without the token: {[(r['client'], r['path'].split('?')[0]) for r in bare]}")
    assert asked and all(r["https"] for r in asked)
    assert all("/tree/" in r["path"] and r["client"] == str(lab.GATEWAY) for r in bare) and len(bare) <= 1
    assert all(v == [TOKEN] for v in tokens.values()) and h["address"] in tokens   # the job's own requests
    assert elsewhere == [] and on_disk == "600 root"
    assert argv == "" and TOKEN not in shown and "hf-token:/etc/rigup/hf-token" in shown
    assert TOKEN not in out and leaks.split() == ["0"], leaks

    # the host's probe, with the token, meets a next page on another origin: not followed
    hub_module.reset()
    hub_module.hostile("lab/hostile", next_page=f"{hub_module.other_url()}/api/models/lab/hostile/tree/x?cursor=2")
    again = dict(model, dest=f"{dest}2", size_gib=0.01, family="glm-5.3-flash")   # the controller asks nothing
    try:
        run = converge(play, tmp_path, {name: {"models": {"secret": again}, **secure}}, check=False, env=env)
        asked, elsewhere = hub_module.requests(), hub_module.other_requests()
    finally:
        hub_module.reset()
    line = next(ln.strip() for ln in run.output.splitlines() if "refused: models.secret" in ln)
    print(f"host's probe with the token, a next page elsewhere: refused in {run.seconds:.1f} s; hub: {len(asked)} "
          f"requests, {sum(r['auth'] for r in asked)} with the token; other origin: {len(elsewhere)}\n{line}")
    assert run.returncode != 0 and "has its next page on another host" in line and endpoint in line
    assert asked and all(r["auth"] for r in asked) and elsewhere == []
    assert TOKEN not in run.output
    on_host(lab, name, f"rm -rf {dest} {dest}2")


# ------------------------------------------------------------------ the hub down (issue 65)

HUB_DOWN_DEST = "/srv/models/hubdown"
HUB_BACK_S = 120      # the job's next retry after the hub is back: its backoff (at most fetcher.BACKOFF_MAX_S) and more


def refusing(url: str) -> bool:
    """Whether ``url``'s port refuses a connection (the hub's process gone, its port closed)."""
    import socket
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    try:
        socket.create_connection((parts.hostname, parts.port), timeout=2).close()
        return False
    except ConnectionRefusedError:
        return True
    except OSError:   # not yet refusing (a timeout): asked again
        return False


class HubDown:
    """The lab hub stopped for real (its process ended, its port refusing) until ``back()``, which
    runs on leaving the ``with`` too, whatever failed: the module's other tests need it."""

    def __init__(self, hub_module):
        self.hub, self.url = hub_module, hub_module.url()

    def __enter__(self):
        self.hub.stop()
        wait_for(lambda: refusing(self.url), 30, f"{self.url} to refuse connections")
        return self

    def back(self):
        if refusing(self.url):
            self.hub.serve()
            self.hub.rate(0)

    def __exit__(self, *exc):
        self.back()


def note(output: str, start: str) -> str:
    """status.py's note under a host's row that starts with ``start``, its wrapped lines joined."""
    lines = output.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(start))
    rest = [lines[at].strip()]
    for ln in lines[at + 1:]:
        if not ln.startswith("      ") or not ln.strip():
            break
        rest.append(ln.strip())
    return " ".join(rest)


def test_the_hub_down_at_a_converge_refuses_the_host_at_preflight_naming_the_hub(lab, hub, play, tmp_path):
    """A model whose commit (a branch) or listing (no size_gib given) only the hub can tell, the hub
    stopped: the host refused before anything changes, the model named with the hub's URL and
    why, in bounded time; one converge per model, so each refusal stands on its own."""
    hub_module, revs = hub
    name = lab.hosts()[0]["name"]
    url = hub_module.url()
    models = {"hubdown": {"repo": "lab/tiny-gguf", "revision": revs["tiny"], "dest": HUB_DOWN_DEST},
              "hubbranch": {"repo": "lab/tiny-gguf", "revision": "main", "dest": f"{HUB_DOWN_DEST}-branch"}}
    # the lab's nvidia-smi (which preflight runs) makes its state directory at its first call on a new host
    on_host(lab, name, f"rm -rf {HUB_DOWN_DEST} {HUB_DOWN_DEST}-branch; nvidia-smi >/dev/null 2>&1; true")
    before = units(lab, name)
    on_host(lab, name, f"touch {MARK}")
    runs = {}
    with HubDown(hub_module):
        for model, entry in models.items():
            # a cache of its own: the hub's answers kept by an earlier run would spare the controller asking
            runs[model] = converge(play, tmp_path, {name: {"models": {model: entry}, "models_allow_unpinned": True}},
                                   check=False, env={"RIGUP_CACHE_DIR": str(tmp_path / "hub-cache")})
    for model, run in runs.items():
        said = [ln.strip() for ln in run.output.splitlines() if f"models.{model}" in ln]
        print(f"\nhub down, model {model}: exit {run.returncode} in {run.seconds:.1f} s (bound {PLAN_S} s)\n"
              + "\n".join(said))
        refused = [ln for ln in said if f"[{name}] refused: models.{model}" in ln]
        assert run.returncode != 0 and refused, run.output[-3000:]
        # the reason as the one who asked saw it: the controller, the port refusing; the host, through
        # the lab's HTTP proxy (tinyproxy), its error page in words (fetcher.hub_files)
        assert url in refused[0] and re.search(r"connection refused|unable to connect to the remote", refused[0], re.I)
        assert "<" not in refused[0], refused
        assert run.seconds < PLAN_S
    written, after = touched(lab, name), units(lab, name)
    print(f"written on {name}: {written or 'nothing'}; unit and /etc/rigup lines changed: "
          f"{len(set(after.splitlines()) ^ set(before.splitlines()))}")
    assert written == [] and after == before
    assert lab.ssh(name, f"test -e {HUB_DOWN_DEST} || test -e {HUB_DOWN_DEST}-branch").returncode != 0
    on_host(lab, name, f"rm -f {MARK}")


def test_the_hub_down_mid_download_the_job_retries_status_says_why_then_completes(lab, hub, play, tmp_path):
    """The hub stopped while a job downloads: the job keeps its bytes and retries within itself (no
    restart by systemd), status.py's line for it names the hub's failure; the hub back, the next
    converge completes the model with the bytes missing only, and the one after changes nothing."""
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    started(lab, hub_module, name, 16 << 20)
    try:
        converge(play, tmp_path, {name: big(revs)})
        wait_for(lambda: progress(lab, name, DEST).get("bytes", 0) >= BIG * 0.3, 120, "30% of the file")
        with HubDown(hub_module) as down:
            stopped = time.monotonic()
            retrying = wait_for(lambda: (p := progress(lab, name, DEST)) and "cannot reach the hub" in (
                p.get("detail") or p.get("error") or "") and p, 60, "the job to meet the hub down")
            seen = time.monotonic() - stopped
            shown = status(tmp_path, name)
            line = note(shown.output, "download big")
            part = int(on_host(lab, name, f"stat -c %s {DEST}/.rigup-fetch/parts/big.bin"))
            restarts = on_host(lab, name, f"systemctl show -p NRestarts --value {UNIT}").strip()
            active = on_host(lab, name, f"systemctl is-active {UNIT} || true").strip()
            print(f"\nhub down at {100 * part / BIG:.0f}% ({part} bytes kept): the job met it in {seen:.1f} s: "
                  f"{retrying.get('detail') or retrying.get('error')}\nstatus.py: {line}\n"
                  f"unit {active}, systemd restarts {restarts}, hub down for {time.monotonic() - stopped:.1f} s")
            assert "cannot reach the hub" in line and "Connection refused" in line, shown.output[-3000:]
            assert active == "active" and restarts == "0"   # retrying in the same job, not a crash loop
            down.back()
        back = time.monotonic()
        run = converge(play, tmp_path, {name: big(revs, wait=True)})
        completed = time.monotonic() - back
    finally:
        hub_module.rate(0)
    done = progress(lab, name, DEST)
    served = hub_module.bytes_served(h["address"])   # the hub restarted: its counters count from then
    print(f"the hub back: complete {completed:.1f} s later (bound {HUB_BACK_S} s), {done['resumes']} resume(s) "
          f"in the one job; the hub sent {served} bytes for the {BIG - part} missing")
    assert marker(lab, name, DEST)["bytes"] == BIG and done["state"] == "complete" and done["detail"] == ""
    assert completed < HUB_BACK_S
    assert served <= BIG - part   # nothing kept was fetched again
    assert on_host(lab, name, f"systemctl show -p NRestarts --value {UNIT} 2>/dev/null || true").strip() in ("", "0")
    again = converge(play, tmp_path, {name: big(revs, wait=True)})
    print(f"the converge after: {again.totals['changed']} changed, {again.seconds:.1f} s")
    assert again.totals["changed"] == 0, again.changed_operations()
    assert "model big: complete" in run.output + again.output
