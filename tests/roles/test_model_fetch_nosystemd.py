"""roles/model_fetch on a lab host without systemd, as a docker-style rental container runs (sshd
alone: ``lab.up(..., init=False)``), with the play and helpers of test_model_fetch.py: the job
runs in a tmux session, or with setsid where tmux is missing, outlives pyinfra and its SSH
connections, resumes after a kill -9, is replaced when its plan changes, and a peer copies from
the host's share server (started with setsid too).

Bytes are the hub's total (only this host fetches meanwhile): the job runs in the environment of
the SSH session that started it, whose proxy (/etc/environment) it reaches the hub through.
"""

import pytest

from tests.conftest import on_host
from tests.roles.test_model_fetch import BIG, converge, marker, model, progress, wait_for
from tests.roles.test_model_fetch import hub, play  # noqa: F401 (fixtures)

pytestmark = pytest.mark.lab
DEST = "/srv/models/big"
LOCK = f"{DEST}/.rigup-fetch/lock"   # held by the job, which writes its pid there
SESSION = "rigup-fetch-big"


@pytest.fixture(scope="module")
def bare(lab):
    """A host of profile none booted without systemd; removed at the end."""
    n = len(lab.hosts()) + 1
    lab.up(1, "none", first=n, init=False)
    name = f"lab{n}"
    try:
        assert lab.ssh(name, "test -d /run/systemd/system").returncode != 0
        with pytest.raises(lab.LabError, match=f"{name} runs without systemd"):
            lab.reboot(name)
        yield name
    finally:
        lab.remove(name)


def big(revs, **kw):
    # the controller's poll of a model with wait: true, every second (its default: 10 s)
    return {"models": {"big": model(revs, "big", include=["big.bin"], **kw)}, "model_fetch_wait_interval": 1}


def running(lab, host):
    """True while a job holds the model's lock (what the role's probe reads)."""
    return lab.ssh(host, f"[ -e {LOCK} ] && ! flock -n {LOCK} true").returncode == 0


def jobs(lab, host, what="rigup-fetch fetch"):
    """How many python3 processes (or rigup-share, a script of its own name) on ``host`` run ``what``."""
    return int(on_host(lab, host, f"ps -C python3,rigup-share -o args= | grep -c '{what}' || true"))


def goes_on_without_ssh(lab, host):
    """Once pyinfra's SSH sessions are gone (only this check's is left), the job still fetches."""
    wait_for(lambda: on_host(lab, host, "ps -C sshd -o args= | grep -c '@' || true").strip() == "1", 30,
             "pyinfra's SSH sessions to end")
    at = progress(lab, host, DEST).get("bytes", 0)
    wait_for(lambda: progress(lab, host, DEST).get("bytes", 0) > at, 30, "the download to go on")
    assert running(lab, host)


def test_job_in_tmux_outlives_pyinfra_and_a_converge_meanwhile_changes_nothing(lab, hub, play, bare, tmp_path):
    hub_module, revs = hub
    hub_module.reset()
    hub_module.rate(5 << 20)  # 256 MiB in about 51 s
    try:
        run = converge(play, tmp_path, {bare: big(revs)})
        assert any(op.endswith("Fetch model big") for op in run.changed_operations())
        on_host(lab, bare, f"tmux has-session -t ={SESSION}")
        goes_on_without_ssh(lab, bare)
        pid = on_host(lab, bare, f"cat {LOCK}")
        during = converge(play, tmp_path, {bare: big(revs)})
        assert during.totals["changed"] == 0, during.changed_operations()
        assert f"[{bare}] model big: " in during.output and "MiB/s, ETA" in during.output
        assert on_host(lab, bare, f"cat {LOCK}") == pid and jobs(lab, bare) == 1
    finally:
        hub_module.rate(0)
    got = wait_for(lambda: marker(lab, bare, DEST), 180, "the marker")
    assert got["files"] == ["big.bin"] and got["bytes"] == BIG
    assert hub_module.bytes_served() <= BIG * 1.01
    wait_for(lambda: lab.ssh(bare, f"tmux has-session -t ={SESSION}").returncode != 0, 30, "the session to end")


def test_kill_9_at_half_resumes_with_the_remaining_bytes(lab, hub, play, bare, tmp_path):
    hub_module, revs = hub
    on_host(lab, bare, f"rm -rf {DEST}")
    hub_module.reset()
    hub_module.rate(20 << 20)
    try:
        converge(play, tmp_path, {bare: big(revs)})
        wait_for(lambda: progress(lab, bare, DEST).get("bytes", 0) >= BIG // 2, 120, "half of the file")
        on_host(lab, bare, f"kill -9 $(cat {LOCK}); while ! flock -n {LOCK} true; do sleep 0.2; done")
    finally:
        hub_module.rate(0)
    part = int(on_host(lab, bare, f"stat -c %s {DEST}/.rigup-fetch/parts/big.bin"))
    assert BIG * 0.4 < part < BIG and marker(lab, bare, DEST) is None
    assert lab.ssh(bare, f"tmux has-session -t ={SESSION}").returncode != 0  # it ended with its job
    hub_module.reset()
    run = converge(play, tmp_path, {bare: big(revs, wait=True)})
    assert "stopped at" in run.output and "resumed" in run.output
    again = hub_module.bytes_served()
    print(f"\nno systemd: kill -9 at {100 * part / BIG:.0f}%: the rerun fetched {again} bytes, "
          f"{again - (BIG - part)} more than the remaining {BIG - part} ({100 * (again - (BIG - part)) / BIG:.2f}% "
          "of the file)")
    assert again <= (BIG - part) + BIG * 0.10
    assert marker(lab, bare, DEST)["bytes"] == BIG


def test_a_changed_plan_stops_the_running_job_and_starts_its_own(lab, hub, play, bare, tmp_path):
    hub_module, revs = hub
    on_host(lab, bare, f"rm -rf {DEST}")
    hub_module.rate(5 << 20)
    try:
        converge(play, tmp_path, {bare: big(revs)})
        wait_for(lambda: progress(lab, bare, DEST).get("bytes", 0) > 0, 60, "the job to start")
        old = on_host(lab, bare, f"cat {LOCK}")
        more = {"models": {"big": model(revs, "big", include=["big.bin", "config.json"])}}
        run = converge(play, tmp_path, {bare: more})
        assert any(op.endswith("Fetch model big") for op in run.changed_operations())
        wait_for(lambda: running(lab, bare) and on_host(lab, bare, f"cat {LOCK}") != old, 30, "the new job")
        assert jobs(lab, bare) == 1
    finally:
        hub_module.rate(0)
    got = wait_for(lambda: marker(lab, bare, DEST), 180, "the marker")
    assert got["files"] == ["big.bin", "config.json"]


@pytest.fixture
def no_tmux(lab, bare):
    """tmux hidden on the host for one test, as on an image without it."""
    on_host(lab, bare, "mv /usr/bin/tmux /usr/bin/tmux.hidden")
    try:
        yield
    finally:
        on_host(lab, bare, "mv /usr/bin/tmux.hidden /usr/bin/tmux")


def test_without_tmux_one_job_starts_with_setsid_and_completes(lab, hub, play, bare, no_tmux, tmp_path):
    hub_module, revs = hub
    on_host(lab, bare, f"rm -rf {DEST}")
    hub_module.reset()
    hub_module.rate(5 << 20)
    try:
        run = converge(play, tmp_path, {bare: big(revs)})
        assert any(op.endswith("Fetch model big") for op in run.changed_operations())
        goes_on_without_ssh(lab, bare)
        pid = on_host(lab, bare, f"cat {LOCK}").strip()
        leader = on_host(lab, bare, f"ps -o args= -p $(ps -o sid= -p {pid})")
        assert "rigup-fetch fetch" in leader  # a session of its own (setsid), not the SSH session's
        again = converge(play, tmp_path, {bare: big(revs)})
        assert again.totals["changed"] == 0, again.changed_operations()
        assert jobs(lab, bare) == 1 and on_host(lab, bare, f"cat {LOCK}").strip() == pid
    finally:
        hub_module.rate(0)
    got = wait_for(lambda: marker(lab, bare, DEST), 180, "the marker")
    assert got["bytes"] == BIG and jobs(lab, bare) == 0
    assert hub_module.bytes_served() <= BIG * 1.01


def test_a_converge_after_completion_changes_nothing(lab, hub, play, bare, tmp_path):
    hub_module, revs = hub
    run = converge(play, tmp_path, {bare: big(revs)})
    assert run.totals["changed"] == 0, run.changed_operations()
    assert f"[{bare}] model big: complete, 1 file(s)" in run.output
    assert lab.ssh(bare, "ls /etc/systemd/journald.conf.d/rigup.conf").returncode != 0  # base left journald be
    print(f"\nno systemd: a converge with nothing to do took {run.seconds:.1f} s")


def test_a_peer_copies_from_its_share_server_started_with_setsid(lab, hub, play, bare, no_tmux, tmp_path):
    hub_module, revs = hub
    peer = lab.hosts()[1]["name"]
    include = ["*.gguf", "config.json"]
    data = {bare: {"models": {"tiny": model(revs, "tiny", include=include, dest="/srv/models/tiny-bare", wait=True)},
                   "model_fetch_wait_interval": 1},
            peer: {"models": {"tiny": model(revs, "tiny", include=include, dest="/srv/models/tiny-from-bare",
                                            fetch_from=bare, wait=True)}, "model_fetch_wait_interval": 1}}
    run = converge(play, tmp_path, data)
    assert "Serve completed models to peers" in run.output
    assert marker(lab, peer, "/srv/models/tiny-from-bare") == marker(lab, bare, "/srv/models/tiny-bare")
    assert jobs(lab, bare, "rigup-share share") == 1
    again = converge(play, tmp_path, data)
    assert again.totals["changed"] == 0, again.changed_operations()
    assert jobs(lab, bare, "rigup-share share") == 1


def test_serving_and_power_caps_are_refused_before_anything_changes(lab, hub, play, bare, tmp_path):
    hub_module, revs = hub
    on_host(lab, bare, "touch /tmp/before-refusal")
    wanted = {**big(revs), "llama_server_instances": {"chat": {"model": "big", "port": 8081}}, "gpu_power_watts": 300}
    run = converge(play, tmp_path, {bare: wanted}, check=False)
    assert run.returncode != 0
    for what in ("llama_server_instances (chat)", "gpu_power_watts"):   # each role refuses its own
        assert f"[{bare}] refused: {what} on a host without systemd: they run as systemd units" in run.output
    assert on_host(lab, bare, "find /etc /opt /srv /var/lib/rigup -newer /tmp/before-refusal | head -5") == ""
