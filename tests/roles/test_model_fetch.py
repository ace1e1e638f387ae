"""roles/model_fetch on the lab, against the lab's hub (tests/lab/hub.py, on the gateway): a
download that completes and verifies, refusals before any byte, a kill -9 at half way that
resumes, pyinfra killed mid-run, a corrupted shard, and a second host fed by the first.

The play is preflight + base + model_fetch (the llama.cpp build is not needed here), run as a
user runs pyinfra; per-host models come from a small inventory that wraps inventory/lab.py.
Bytes are counted by the hub, per lab host.
"""

import json
import re
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import on_host
from tests.converge import PYINFRA, ROOT, pyinfra

pytestmark = pytest.mark.lab

PLAY = """from pyinfra import host
from roles import base, in_order, model_fetch, preflight
from rigup.config import configure
cfg = configure(host, in_order())
plan = preflight.run(in_order(), cfg)
base.apply(plan, cfg)
model_fetch.apply(plan, cfg)
model_fetch.waited(plan, cfg)
model_fetch.pruned(plan, cfg)
"""
INVENTORY = """import json as _json, runpy as _runpy
_base = _runpy.run_path({lab_inventory!r})
_extra = _json.loads({extra!r})
def _with(group):
    hosts, data = group
    return ([(n, {{**d, **_extra.get(n, {{}})}}) for n, d in hosts], data)
a100 = _with(_base["a100"])
none = _with(_base["none"])
lab = _with(_base["lab"])
all = _base["all"]
"""
BIG = 256 << 20


@pytest.fixture(scope="module")
def hub(lab):
    from tests.lab import hub as hub_module

    hub_module.serve()
    shards = hub_module.gguf_shards("tiny", 3)
    config = hub_module.CACHE / "tiny-config.json"
    lab.write(config, '{"architectures": ["LlamaForCausalLM"]}\n')
    revs = {
        "tiny": hub_module.publish("lab/tiny-gguf", {**shards, "config.json": config, "README.md": config}),
        "big": hub_module.publish("lab/big", {"big.bin": hub_module.random_file("big-256m.bin", BIG),
                                              "config.json": config}),
    }
    hub_module.rate(0)
    yield hub_module, revs
    hub_module.rate(0)


@pytest.fixture(scope="module")
def play(tmp_path_factory):
    path = tmp_path_factory.mktemp("model_fetch") / "play.py"
    path.write_text(PLAY)
    return path


def model(revs, name, **kw):
    repo = {"tiny": "lab/tiny-gguf", "big": "lab/big"}[name]
    return {"repo": repo, "revision": revs[name], **kw}


def converge(play, tmp_path, host_data: dict, *args, check=True, popen=False, env=None):
    """The play on the hosts of ``host_data`` ({host: {var: value}}), with the hub as endpoint
    (``env``: more of the controller's environment)."""
    from tests.lab import hub as hub_module

    # a job that waits for ever fails the test in minutes, not at the run's 30 min limit
    bounded = {"model_fetch_wait_timeout": 600, "model_fetch_peer_wait": 600}
    extra = {h: {"hf_endpoint": hub_module.url(), "llama_server_instances": {}, **bounded, **d}
             for h, d in host_data.items()}
    inventory = tmp_path / f"inventory_{int(time.monotonic() * 1000)}.py"
    inventory.write_text(INVENTORY.format(lab_inventory=str(ROOT / "inventory/lab.py"), extra=json.dumps(extra)))
    argv = [str(inventory), str(play), *(a for h in host_data for a in ("--limit", h)), *args]
    if popen:
        return subprocess.Popen([PYINFRA, "-y", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True, env={**os.environ, **(env or {})})
    run = pyinfra(*argv, env=env)
    if check:
        assert run.returncode == 0, run.output[-5000:]
    return run


def marker(lab, host, dest):
    out = lab.ssh(host, f"cat {dest}/.rigup-complete.json")
    return json.loads(out.stdout) if out.returncode == 0 else None


def progress(lab, host, dest):
    out = lab.ssh(host, f"cat {dest}/.rigup-fetch/progress.json 2>/dev/null")
    return json.loads(out.stdout) if out.returncode == 0 and out.stdout.strip() else {}


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def fetch_ops(run):
    return [op for op in run.changed_operations() if "model" in op.lower() or "rigup-fetch" in op]


def test_refused_before_any_byte(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    on_host(lab, name, "mkdir -p /mnt/small && (mountpoint -q /mnt/small || mount -t tmpfs -o size=64m,mode=755 tmpfs /mnt/small)")
    hub_module.reset()
    models = {
        "noinc": model(revs, "tiny", include=["*.safetensors"]),
        "norev": {"repo": "lab/tiny-gguf", "revision": "0" * 40},
        "norepo": {"repo": "lab/nothing-here", "revision": revs["tiny"]},
        "halfset": model(revs, "tiny", include=["tiny-00001-of-00003.gguf", "tiny-00003-of-00003.gguf"]),
    }
    # the size comes from the hub's listing on the controller: preflight refuses the host
    small = converge(play, tmp_path, {name: {"models": {"small": model(revs, "big", include=["big.bin"],
                                                                         dest="/mnt/small/big")}}}, check=False)
    print("\n" + "\n".join(ln for ln in small.output.splitlines() if "refused" in ln or "size_gib" in ln))
    assert small.returncode != 0
    assert f"[{name}] refused: not enough free disk for model small" in small.output
    assert "at /mnt/small/big" in small.output and "from the hub" in small.output
    # what only the host's probe of the hub tells: refused by model_fetch, each with its key
    run = converge(play, tmp_path, {name: {"models": models}}, check=False)
    assert run.returncode != 0
    out = run.output
    assert "models.noinc.include" in out and "'*.safetensors' matches no file of lab/tiny-gguf" in out
    assert "models.norev.revision" in out and f"{'0' * 40} is not a commit of lab/tiny-gguf" in out
    assert "models.norepo.repo" in out and "'lab/nothing-here' not found" in out
    assert "models.halfset.include" in out and "lacks shard(s) 00002" in out
    assert "inventory host data of" in out  # where the value came from
    # before any byte, and before any other change: no job, no directory, no byte from the hub
    assert hub_module.bytes_served(h["address"]) == 0
    assert on_host(lab, name, "ls -A /mnt/small").strip() == ""
    assert lab.ssh(name, "ls /srv/models/noinc").returncode != 0
    assert "rigup-fetch" not in on_host(lab, name, "systemctl list-units --all --no-legend 'rigup-fetch-*'")


def test_completes_and_verifies(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    hub_module.reset()
    data = {name: {"models": {"tiny": model(revs, "tiny", include=["*.gguf", "config.json"], wait=True)}}}
    run = converge(play, tmp_path, data)
    assert any(op.endswith("Fetch model tiny") for op in run.changed_operations())
    assert f"[{name}] model tiny: complete, 4 file(s)" in run.output
    got = marker(lab, name, "/srv/models/tiny")
    assert got["repo"] == "lab/tiny-gguf" and got["revision"] == revs["tiny"]
    assert got["files"] == ["config.json", "tiny-00001-of-00003.gguf", "tiny-00002-of-00003.gguf",
                            "tiny-00003-of-00003.gguf"]
    sizes = on_host(lab, name, "cd /srv/models/tiny && stat -c %s " + " ".join(got["files"]))
    assert got["bytes"] == sum(int(s) for s in sizes.split())
    assert hub_module.bytes_served(h["address"]) == got["bytes"]
    from rigup.models import first_gguf

    assert first_gguf(got["files"]) == "tiny-00001-of-00003.gguf"
    # the job ran as the service user, its unit is gone (--collect), no partial is left
    assert on_host(lab, name, "stat -c %U /srv/models/tiny/tiny-00001-of-00003.gguf").strip() == "rigup"
    assert on_host(lab, name, "find /srv/models/tiny/.rigup-fetch/parts -type f | wc -l").strip() == "0"
    again = converge(play, tmp_path, data)
    assert fetch_ops(again) == [] and again.totals["changed"] == 0, again.changed_operations()
    status = pyinfra(str(tmp_path / sorted(p.name for p in tmp_path.glob("inventory_*.py"))[-1]), "status.py",
                     "--limit", name)
    lines = status.output.splitlines()   # the row counts the models downloaded; one not complete has a row under it
    row = [ln for ln in lines if ln.startswith(f"{name} ")]
    assert status.returncode == 0 and row and re.search(r" (\d+)/\1 ", row[0]), status.output[-2000:]
    assert not [ln for ln in lines if ln.startswith("  download tiny")], status.output[-2000:]


def test_corrupted_shard_is_fetched_again(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name = h["name"]
    dest = "/srv/models/tiny"
    shard = f"{dest}/tiny-00002-of-00003.gguf"
    size = int(on_host(lab, name, f"stat -c %s {shard}"))
    on_host(lab, name, f"dd if=/dev/zero of={shard} bs=4096 seek=64 count=16 conv=notrunc status=none")
    hub_module.reset()
    data = {name: {"models": {"tiny": model(revs, "tiny", include=["*.gguf", "config.json"], wait=True)}}}
    run = converge(play, tmp_path, data)
    assert f"damaged since verified: {shard.rsplit('/', 1)[1]}" in run.output
    assert any(op.endswith("Fetch model tiny") for op in run.changed_operations())
    assert hub_module.bytes_served(h["address"]) == size  # that shard, nothing else
    assert marker(lab, name, dest) is not None
    assert on_host(lab, name, f"od -An -tx1 -j 262144 -N 4 {shard}").split() != ["00"] * 4


def test_pyinfra_killed_mid_run_download_goes_on(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name, dest = h["name"], "/srv/models/big"
    on_host(lab, name, f"rm -rf {dest}")
    hub_module.reset()
    hub_module.rate(10 << 20)  # a WAN link: 256 MiB in about 26 s
    data = {name: {"models": {"big": model(revs, "big", include=["big.bin"], wait=True)}}}
    proc = converge(play, tmp_path, data, popen=True)
    try:
        wait_for(lambda: progress(lab, name, dest).get("bytes", 0) > 0, 120, "the job to start")
        os.killpg(proc.pid, signal.SIGKILL)  # pyinfra and its SSH connection are gone
        proc.wait()
        unit = on_host(lab, name, "systemctl show -p ActiveState,InvocationID rigup-fetch-big")
        assert "ActiveState=active" in unit
        # a converge while it runs changes nothing and prints the progress
        during = converge(play, tmp_path, {name: {"models": {"big": model(revs, "big", include=["big.bin"])}}})
        assert during.totals["changed"] == 0, during.changed_operations()
        assert f"[{name}] model big: " in during.output and "MiB/s, ETA" in during.output
        assert on_host(lab, name, "systemctl show -p ActiveState,InvocationID rigup-fetch-big") == unit
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        hub_module.rate(0)
    got = wait_for(lambda: marker(lab, name, dest), 180, "the marker")
    assert got["files"] == ["big.bin"] and got["bytes"] == BIG
    assert hub_module.bytes_served(h["address"]) <= BIG * 1.01


def test_kill_9_at_half_resumes_with_the_remaining_bytes(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name, dest = h["name"], "/srv/models/big"
    on_host(lab, name, f"rm -rf {dest}")
    hub_module.reset()
    hub_module.rate(20 << 20)
    data = {name: {"models": {"big": model(revs, "big", include=["big.bin"])}}}
    try:
        converge(play, tmp_path, data)
        wait_for(lambda: progress(lab, name, dest).get("bytes", 0) >= BIG // 2, 120, "half of the file")
        on_host(lab, name, "systemctl kill -s KILL rigup-fetch-big; "
                           "while systemctl is-active -q rigup-fetch-big; do sleep 0.2; done")
    finally:
        hub_module.rate(0)
    before = hub_module.bytes_served(h["address"])
    part = int(on_host(lab, name, f"stat -c %s {dest}/.rigup-fetch/parts/big.bin"))
    assert BIG * 0.4 < part < BIG and marker(lab, name, dest) is None
    hub_module.reset()
    data[name]["models"]["big"]["wait"] = True
    run = converge(play, tmp_path, data)
    assert "stopped at" in run.output and "resumed" in run.output
    again = hub_module.bytes_served(h["address"])
    print(f"\nkill -9 at {100 * part / BIG:.0f}% ({before} bytes served): the rerun fetched {again} bytes, "
          f"{again - (BIG - part)} more than the remaining {BIG - part} ({100 * (again - (BIG - part)) / BIG:.2f}% of the file)")
    assert again <= (BIG - part) + BIG * 0.10
    assert marker(lab, name, dest)["bytes"] == BIG


def test_second_host_fetches_from_the_first(lab, hub, play, tmp_path):
    hub_module, revs = hub
    first, second = lab.hosts()[:2]
    include = ["*.gguf", "config.json"]
    hub_module.reset()
    data = {first["name"]: {"models": {"tiny": model(revs, "tiny", include=include),
                                       "big": model(revs, "big", include=["big.bin"])}},
            second["name"]: {"models": {"tiny": model(revs, "tiny", include=include, fetch_from=first["name"], wait=True),
                                        "big": model(revs, "big", include=["big.bin"], fetch_from=first["name"], wait=True)}}}
    run = converge(play, tmp_path, data)
    assert "Serve completed models to peers" in run.output
    for dest in ("/srv/models/tiny", "/srv/models/big"):
        assert marker(lab, second["name"], dest) == marker(lab, first["name"], dest)
    assert hub_module.bytes_served(second["address"]) == 0  # only the hub's file lists, no file byte
    model_bytes = sum(marker(lab, first["name"], d)["bytes"] for d in ("/srv/models/tiny", "/srv/models/big"))
    assert hub_module.bytes_served() <= model_bytes  # the fleet took it from the hub once at most
    again = converge(play, tmp_path, data)
    assert again.totals["changed"] == 0, again.changed_operations()
    # the share server: on the first host's own address, for the fleet's token alone
    listen = on_host(lab, first["name"], "ss -Hltnp 'sport = :8091'")
    assert f"{first['address']}:8091" in listen and '"rigup-share"' in listen, listen
    for h in (first, second):
        assert on_host(lab, h["name"], "stat -c '%U %a' /etc/rigup/share-token").split() == ["root", "600"]
    token = on_host(lab, first["name"], "cat /etc/rigup/share-token")
    url = f"http://{first['address']}:8091/rigup/complete/lab/big/{revs['big']}"
    outside = [urllib_status(url), urllib_status(url, "Bearer not-the-token"), urllib_status(url, f"Bearer {token}")]
    print(f"\nshare server from outside the inventory: no token {outside[0]}, a wrong one {outside[1]}; "
          f"the fleet's {outside[2]}")
    assert outside == [401, 401, 200]
    # no peer copies from the first host any more: its share server stops
    for entry in data[second["name"]]["models"].values():
        entry.pop("fetch_from")
    stop = converge(play, tmp_path, data)
    assert "Stop serving models to peers" in " ".join(stop.changed_operations())
    assert lab.ssh(first["name"], "systemctl is-active rigup-share").stdout.strip() != "active"


def urllib_status(url: str, auth: str | None = None) -> int:
    """The HTTP status of a GET of ``url`` from this machine (outside the inventory)."""
    import urllib.error
    import urllib.request
    request = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        with direct.open(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_token_never_goes_to_a_hub_in_clear(lab, hub, play, tmp_path):
    """The lab hub is http:// (hf_endpoint_insecure: true, inventory/lab.py): a token source with it
    is refused before anything changes, naming the key, and the hub sees no token (rigup sends a
    token only over https://: tests/unit/test_model_fetch_hostile_hub.py checks it reaches that origin
    alone; that the host keeps it out of argv, units and logs is roles/model_fetch's env file)."""
    hub_module, revs = hub
    h = lab.hosts()[1]
    name, dest = h["name"], "/srv/models/tokened"
    token = f"hf_rigupLabToken{int(time.time())}"
    src = tmp_path / "hf-token"
    src.write_text(token + "\n")
    hub_module.reset()
    data = {name: {"model_fetch_hf_token_src": str(src),
                   "models": {"tokened": model(revs, "tiny", include=["config.json"], dest=dest, wait=True)}}}
    run = converge(play, tmp_path, data, check=False)
    print(f"\na token with the http:// lab hub: exit {run.returncode}; "
          f"{[ln for ln in run.output.splitlines() if 'hf_endpoint_insecure' in ln][:1]}")
    assert run.returncode != 0
    assert f"[{name}] refused" in run.output and "hf_endpoint_insecure" in run.output, run.output[-3000:]
    assert "Starting operation" not in run.output
    assert hub_module.tokens_seen(h["address"]) == [] and token not in run.output
    assert marker(lab, name, dest) is None


def test_a_revision_change_fetches_only_what_changed_then_switches_and_prunes(lab, hub, play, tmp_path):
    hub_module, revs = hub
    h = lab.hosts()[0]
    name, dest = h["name"], "/srv/models/revised"
    shards = hub_module.gguf_shards("tiny", 3)
    configs = []
    for k in (1, 2):
        configs.append(tmp_path / f"config-{k}.json")
        configs[-1].write_text(f'{{"architectures": ["LlamaForCausalLM"], "rigup_lab_revision": {k}}}\n')
    rev1 = hub_module.publish("lab/revised", {**shards, "config.json": configs[0]})
    rev2 = hub_module.publish("lab/revised", {**shards, "config.json": configs[1]})

    def entry(rev, **kw):
        return {name: {"models": {"revised": {"repo": "lab/revised", "revision": rev, "dest": dest, "wait": True}},
                       **kw}}

    converge(play, tmp_path, entry(rev1))
    hub_module.reset()
    run = converge(play, tmp_path, entry(rev2))
    fetched = hub_module.bytes_served(h["address"])
    print(f"\nrevision change: {fetched} bytes from the hub (config.json is {configs[1].stat().st_size}); "
          f"the 3 shards ({sum(p.stat().st_size for p in shards.values())} bytes) hard-linked from the revision served")
    assert fetched == configs[1].stat().st_size
    assert f"Model revised: serve revision {rev2[:12]}" in " ".join(run.changed_operations())
    link = on_host(lab, name, f"readlink {dest}; ls -d /srv/models/.revised@* 2>/dev/null || true").split()
    assert link == [f".revised@{rev2[:12]}", f"/srv/models/.revised@{rev2[:12]}"], link  # the old one pruned
    assert marker(lab, name, dest)["revision"] == rev2
    again = converge(play, tmp_path, entry(rev2))
    assert again.totals["changed"] == 0, again.changed_operations()
    # back to rev1 keeping rev2 beside it: rev1's config.json fetched, nothing else
    hub_module.reset()
    converge(play, tmp_path, entry(rev1, models_keep_previous=True))
    assert hub_module.bytes_served(h["address"]) == configs[0].stat().st_size
    kept = on_host(lab, name, f"readlink {dest}; ls -d /srv/models/.revised@*").split()
    assert kept[0] == f".revised@{rev1[:12]}"
    assert sorted(kept[1:]) == sorted(f"/srv/models/.revised@{r[:12]}" for r in (rev1, rev2))
    status = on_host(lab, name, f"stat -c '%U %a' /srv/models/.revised@{rev1[:12]}").strip()
    assert status.split()[0] == "rigup", status
