"""`make bench-ansible` without a lab: its Ansible playbook held to what the roles declare (read
from their source by tests/bench/ansible/declared.py, so that a role's change fails here rather
than the bench at its next run), the playbook written for a lab host's data, and the bench's
recap parsing, variants and results pages on synthetic samples."""

import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests import bench_ansible
from tests.bench.ansible import playbook
from tests.bench.ansible.declared import UNKNOWN, declared
from tests.converge import PYINFRA, ROOT

HOST = re.compile(r"^\[([\w.@/-]+)\] *\n--> Groups: ([^\n]*)\n--> Data:\n(\{.*?\n\})$", re.M | re.S)
MIRRORED = ("base", "model_fetch", "llama_cpp", "gpu_power", "gpu_guard", "llama_server", "metrics", "watchdog")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """lab1's merged data, as pyinfra gives it from inventory/lab.py (debug-inventory) for an a100
    lab host: what the bench writes the playbook from."""
    lab = tmp_path_factory.mktemp("lab")
    (lab / "lab.json").write_text(json.dumps({"gateway": "10.9.0.1", "ssh_key": "/k", "known_hosts": "/kh",
                                              "hosts": [{"name": "lab1", "address": "10.9.0.2", "profile": "a100"}]}))
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("RIGUP_LAB", "RIGUP_SITE"))}
    done = subprocess.run([PYINFRA, "inventory/lab.py", "debug-inventory"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**env, "RIGUP_LAB_DIR": str(lab)})
    hosts = {name: json.loads(d) for name, _, d in HOST.findall(done.stdout + done.stderr)}
    assert done.returncode == 0 and "lab1" in hosts, done.stdout + done.stderr
    return {k: v for k, v in hosts["lab1"].items() if not k.startswith("ssh_")}


def modules() -> list[str]:
    """The mirrored roles' modules that run pyinfra, and rigup/serving.py (llama_server's drop-ins)."""
    found = []
    for role in MIRRORED:
        for path in sorted((ROOT / "roles" / role).glob("*.py")):
            if "pyinfra" in path.read_text():
                found.append(f"roles.{role}" + ("" if path.stem == "__init__" else f".{path.stem}"))
    return found + ["rigup.serving"]


def owner_mode(args: dict) -> dict:
    """A declaration's owner, group and mode as the playbook writes them: pyinfra's put without a
    user leaves the file root's (rigup connects as root); None: left as it is."""
    mode = args.get("mode")
    return {"owner": args.get("user") or ("root" if "src" in args else None),
            "group": args.get("group") or ("root" if "src" in args else None),
            "mode": None if mode is None else "0" + str(mode).lstrip("0")}


def test_the_playbooks_files_and_directories_are_those_the_roles_declare(data):
    prefix = data["rigup_prefix"]
    found = declared(modules(), data)
    writes = [(d.args.get("dest", d.args.get("path")), d) for d in found if d.what in ("file", "dir")]
    unresolved = Counter(d.where.split(":")[0] for p, d in writes if p is UNKNOWN)
    resolved = {p: d for p, d in writes if p is not UNKNOWN}
    # what the roles may write that the lab recipe does not (playbook.check_recipe holds the recipe)
    not_in_recipe = {
        "/etc/rigup/share.json": "a share server for peers: no lab host is a fetch_from peer",
        f"{prefix}/bin/rigup-share": "the same",
        "/etc/default/prometheus": "prometheus_enabled is false",
        f"{prefix}/bin/rigup-watchdog": "no instance is watched (min_tokens_per_s: 0)",
        "/etc/rigup/watchdog.json": "the same",
        "/etc/systemd/system/rigup-watchdog.service": "the same",
        "/etc/systemd/system/rigup-watchdog.timer": "the same",
        "/etc/rigup/balancer": "no replicated instance",
        "/etc/rigup/model-warm.json": "no model is warm",
        "/etc/systemd/system/rigup-model-warm.service": "the same",
        "/etc/systemd/system/rigup-model-warm.timer": "the same",
    }
    # writes whose path only the host's run knows: a build's script and smoke files, a model's
    # job file, a server's drop-in (compared below by the call's mode), a replica's backends; and
    # the serving walk's template unit (its engine's: llama-server's is playbook.LLAMA_UNIT)
    unknown = {"roles/llama_cpp/build.py": 3, "rigup/serving.py": 3}
    files, dirs = playbook.managed_files(data), playbook.directories(data)
    print(f"\n{len(found)} declarations in {len(modules())} modules; {len(resolved)} paths resolved, "
          f"{sum(unresolved.values())} not ({dict(unresolved)}); the playbook has {len(files)} files, {len(dirs)} dirs")
    assert dict(unresolved) == unknown
    assert set(resolved) - set(files) - set(dirs) == set(not_in_recipe)
    dropins = {p for p in files if p.startswith("/etc/systemd/system/rigup-llama@") and p.endswith(".d/rigup.conf")}
    assert set(files) | set(dirs) == (set(resolved) - set(not_in_recipe)) | dropins | {playbook.LLAMA_UNIT}
    serving = next(d for d in found if d.where.startswith("rigup/serving.py") and d.what == "file" and "src" in d.args)
    unit = next(d for d in found if d.where.startswith("rigup/serving.py") and d.what == "file" and "text" in d.args
                and d.args["dest"] is UNKNOWN and "paths" in d.args and d.args["paths"] is UNKNOWN)
    wrong = []
    for path, spec in {**files, **dirs}.items():
        decl = serving if path in dropins else unit if path == playbook.LLAMA_UNIT else resolved[path]
        want = owner_mode(decl.args)
        have = {k: spec[k] for k in ("owner", "group", "mode")}
        if have != want:
            wrong.append(f"{path}: the playbook sets {have}, {decl.where} declares {want}")
        if decl.what != ("dir" if path in dirs else "file"):
            wrong.append(f"{path}: a {decl.what} in {decl.where}")
    assert not wrong, "\n".join(wrong)


def test_the_playbooks_user_units_and_packages_are_those_the_roles_declare(data):
    found = declared(modules(), data)
    tasks = playbook.tasks(data, "lab-base-0123456789")
    user = next(t["ansible.builtin.user"] for t in tasks if "ansible.builtin.user" in t)
    [base_user] = [d.args for d in found if d.what == "user"]
    assert (user["name"], user["home"], user["shell"]) == (base_user["user_name"], base_user["home"],
                                                            base_user["shell"])

    services = [t["ansible.builtin.systemd_service"] for t in tasks if "ansible.builtin.systemd_service" in t]
    started = {s["name"] for s in services if s.get("state") == "started"}
    stopped = {s["name"] for s in services if s.get("state") == "stopped"}
    instances = {f"rigup-llama@{n}.service" for n in data["llama_server_instances"]}  # rigup/serving.py's unit_running
    declared_on = {d.args["unit"] for d in found if d.what == "service" and d.args["enabled"] is True}
    declared_off = {d.args["unit"] for d in found if d.what == "service" and d.args["enabled"] is False}
    print(f"\nunits the playbook starts: {sorted(started)}; stops: {sorted(stopped)}")
    assert started - instances == declared_on - {"prometheus", "rigup-watchdog.timer",   # not in the lab recipe
                                                  "rigup-model-warm.timer"}
    assert stopped <= declared_off and "rigup-watchdog.timer" in stopped

    packages = {p for t in tasks if "ansible.builtin.apt" in t for p in t["ansible.builtin.apt"]["name"]}
    wanted = {p for d in found if d.what == "packages" for p in d.args["packages"]} - {"prometheus", "vmtouch"}
    assert packages == wanted, (sorted(packages), sorted(wanted))


def test_the_playbook_for_a_lab_host_every_task_named_and_changing_nothing_written(data, tmp_path):
    state = {"hosts": [{"name": "lab1", "address": "10.9.0.2"}], "ssh_key": "/k", "known_hosts": "/kh"}
    inventory, site = playbook.write(tmp_path, state, data, "lab-base-0123456789")
    play = yaml.safe_load(site.read_text().replace("!unsafe ", ""))[0]
    names = [t["name"] for t in play["tasks"]]
    copies = [t["ansible.builtin.copy"] for t in play["tasks"] if "ansible.builtin.copy" in t]
    print(f"\n{len(names)} tasks ({len(copies)} copies), {len(play['handlers'])} handlers")
    roles = MIRRORED + ("preflight", "rpc_worker", "balancer")
    assert len(names) == len(set(names)) and all(n.split(": ", 1)[0] in roles for n in names)
    assert all({"owner", "group", "mode", "src", "dest"} <= set(c) for c in copies) and len(copies) == len(
        playbook.managed_files(data))
    notified = {n for t in play["tasks"] for n in t.get("notify", [])}
    assert notified <= {h["name"] for h in play["handlers"]}
    assert json.loads(inventory.read_text())["lab"]["hosts"] == {"lab1": {"ansible_host": "10.9.0.2"}}


@pytest.mark.parametrize("change", [{"prometheus_enabled": True}, {"metrics_enabled": False},
                                    {"rigup_maintenance": True}, {"balancer_gateway": True}])
def test_another_recipe_is_refused(data, change):
    playbook.check_recipe(data)
    with pytest.raises(AssertionError):
        playbook.check_recipe({**data, **change})


def test_a_host_whose_files_differ_from_the_playbook_is_named(data):
    tables = {**playbook.managed_files(data), **playbook.directories(data)}
    meta = {p: {k: s[k] or "someone" for k in ("owner", "group", "mode")} for p, s in tables.items()}
    playbook.check_files("lab1", data, meta)   # a directory the play leaves as it is may be anyone's
    meta[f"{data['rigup_prefix']}/bin/rigup-fetch"]["mode"] = "0644"
    meta[data["rigup_state_dir"]]["owner"] = data["rigup_user"]   # what base made before it was root's
    with pytest.raises(AssertionError, match=r"(?s)rigup-fetch: the playbook sets .*0755.*lab1 has .*0644.*"
                                             r"/var/lib/rigup: the playbook sets .*'root'.*lab1 has .*'rigup'"):
        playbook.check_files("lab1", data, meta)


RECAP = """PLAY RECAP *********************************************************************
lab1                       : ok=47   changed=0    unreachable=0    failed=0    skipped=6    rescued=0    ignored=0
lab2                       : ok=46   changed=1    unreachable=0    failed=0    skipped=6    rescued=0    ignored=0
"""


def test_the_recap_and_the_variants(tmp_path, monkeypatch):
    assert bench_ansible.recap(RECAP) == {
        "lab1": {"ok": 47, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 6},
        "lab2": {"ok": 46, "changed": 1, "unreachable": 0, "failed": 0, "skipped": 6}}
    strategy = tmp_path / "venv/lib/python3.11/site-packages/ansible_mitogen/plugins/strategy"
    strategy.mkdir(parents=True)
    monkeypatch.setattr(bench_ansible, "WORK", tmp_path / "work")
    (tmp_path / "work").mkdir()
    tools = bench_ansible.variants(tmp_path / "venv")
    assert bench_ansible.GOAL_TOOL in tools and len(tools) == 4
    assert {t["ANSIBLE_STRATEGY"] for t in tools.values()} == {"mitogen_linear", "linear"}
    assert tools[bench_ansible.GOAL_TOOL]["ANSIBLE_STRATEGY_PLUGINS"] == str(strategy)


def result(walls: dict[str, tuple[float, float]]) -> dict:
    """A result as main() makes it, from each tool's (1 host, 4 hosts) wall times (3 rounds each)."""
    samples = {tool: {n: [{"wall": w * f, "cpu": w / 2, "hosts_cpu": 0.5} for f in (0.9, 1.0, 1.2)]
                      for n, w in zip((1, 4), pair)} for tool, pair in walls.items()}
    stats = bench_ansible.summary(samples)
    return {"date": "2026-12-02", "commit": "abc1234", "command": "make bench-ansible", "reps": 3, "cpus": 2,
            "versions": "ansible [core 2.19.14], mitogen==0.3.54", "load_before": [1.0, 1.0, 1.0],
            "load_after": [2.0, 2.0, 2.0], "first": {"lab1_s": 50.0}, "idle_hosts_cpu_s_per_s": 0.1, "files": 20,
            "build": "lab-base-x", "commands": 3,
            "tools": {tool: {"per_host": "56 operations", "sizes": stats[tool]} for tool in samples}}


def test_the_results_page_says_whether_the_goal_is_met(tmp_path):
    met = result({bench_ansible.RIGUP: (1.0, 2.0), bench_ansible.GOAL_TOOL: (6.0, 12.0),
                  "Ansible plain (pipelining), gather_facts off": (12.0, 30.0)})
    assert met["tools"][bench_ansible.GOAL_TOOL]["sizes"][4] == {
        "wall_s": [10.8, 12.0, 14.4], "median_s": 12.0, "cpu_s_median": 6.0, "hosts_cpu_s_median": 0.5, "x_rigup": 6.0}
    page = bench_ansible.markdown(met)
    print("\n" + page)
    assert "1 host 6.00x (met), 4 hosts 6.00x (met)" in page
    assert "| Ansible plain (pipelining), gather_facts off | 56 operations | 12.00 | 30.00 | 12.00x | 15.00x |" in page
    short = bench_ansible.markdown(result({bench_ansible.RIGUP: (1.0, 2.0), bench_ansible.GOAL_TOOL: (3.0, 12.0)}))
    assert "1 host 3.00x (NOT met), 4 hosts 6.00x (met)" in short
    stem = bench_ansible.save(met, page, "ansible-mitogen", tmp_path)
    assert stem == tmp_path / "2026-12-02-ansible-mitogen" and stem.with_suffix(".md").read_text() == page
    saved = json.loads(stem.with_suffix(".json").read_text())
    assert saved["tools"][bench_ansible.RIGUP]["sizes"]["1"]["median_s"] == 1.0
