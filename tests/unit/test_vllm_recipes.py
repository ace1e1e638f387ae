"""roles/vllm's recipe forms without a host: a fork at a commit, a base plus a patch series, a
short commit expanded on the host, extra pip packages, a drafter model; and serving that waits for
the unlocked VRAM of an enabled cmpunlocker (the CMP 170HX runbook, docs/cmp170hx.md)."""

import hashlib
import json

import pytest

from rigup.config import ConfigError
from rigup.gpu.plan import unlock_wait
from roles import cmpunlocker
from roles.vllm import command as cmd
from roles.vllm.checks import plan_lines
from roles.vllm.facts import VllmCommit, parse_commits, parse_state, VllmState
from rigup.instances.vllm import instances
from tests.unit.hosts import GLM, REV, data, host, only, refusals

FULL = "79a7108d9c0f4e1b2a3c4d5e6f708192a3b4c5d6"
FORK = {"vllm_git_url": "https://github.com/Morrowmake/vllm-cmp170hx.git", "vllm_git_commit": FULL}
QWEN = {"repo": "Qwen/Qwen3.8-Flash-Next-FP8", "revision": REV, "size_gib": 126.0}
DRAFT = {"repo": "org/qwen-drafter", "revision": REV, "size_gib": 2.2}


def found(*commits, git=True, fetched=True, error=None):
    return {"git": git, "fetched": fetched, "commits": list(commits), "error": error}


def cmp_host(**values):
    """A locked CMP 170HX host's (plan, facts, data), cmpunlocker enabled, with a qwen instance and ``values``."""
    plan, facts = host("cmp170hx")
    d = data(models={"qwen": dict(QWEN)}, vllm_instances={"qwen": {"model": "qwen", "port": 8000, "pp": 4}},
             **{"vllm_pip_version": None, "cmpunlocker_enabled": True, **FORK, **values})
    return plan, facts, d


# -- a short commit, expanded on the host ---------------------------------------------------------

def test_a_short_commit_is_expanded_to_the_one_commit_that_starts_with_it():
    d = {**FORK, "vllm_git_commit": FULL[:7]}
    assert cmd.short_commit(d) == FULL[:7] and cmd.short_commit(FORK) is None
    full = cmd.expanded(d, found(FULL))
    assert full == FULL
    assert cmd.pin(d, full) == {"git": FORK["vllm_git_url"], "commit": FULL, "id": f"git-{FULL[:12]}"}
    with pytest.raises(ConfigError, match="^vllm_git_commit: expected the full 40-hex commit of .*, or a short one"):
        cmd.pin(d)                    # never pinned unexpanded


@pytest.mark.parametrize("what, message", [
    (found(), "no commit of https://github.com/Morrowmake/vllm-cmp170hx.git starts with '79a7108'"),
    (found(FULL, "79a7108" + "0" * 33), "'79a7108' is ambiguous in .*: 2 commits start with it"),
    (found(fetched=False, error="fatal: repository 'x' not found"), "'79a7108' is short, and the host could not fetch .*: fatal: repository 'x' not found"),
    (found("79a7108NOTHEX"), "the host expanded .* not a 40-lowercase-hex commit that starts with it"),
    # a lying host: 40 hex, but not a commit the short id names
    (found("f" * 40), "the host expanded '79a7108' to 'f{40}', not a 40-lowercase-hex commit that starts with it"),
    (found("79a7108\x1b[2J" + "0" * 29), r"the host expanded '79a7108' to '79a7108\\x1b\[2J0+', not"),
])
def test_an_ambiguous_or_unknown_short_commit_is_refused_naming_the_key(what, message):
    d = {**FORK, "vllm_git_commit": FULL[:7]}
    with pytest.raises(ConfigError, match="^vllm_git_commit: " + message):
        cmd.expanded(d, what)
    plan, facts, values = cmp_host(vllm_git_commit=FULL[:7])
    (r,) = only(refusals(plan, {**facts, "reads": {"VllmCommit": what}}, values), "vllm_pin")
    assert r.what == "vllm_git_commit"
    print(r.line("rig-01"))


def test_a_host_without_git_waits_and_is_not_refused():
    plan, facts, values = cmp_host(vllm_git_commit=FULL[:7])
    facts = {**facts, "reads": {"VllmCommit": found(git=False)}}
    assert cmd.expanded(values, found(git=False)) is None
    assert [r for r in refusals(plan, facts, values) if r.check == "vllm_pin"] == []
    assert "which has none yet (roles/base installs it)" in plan_lines(plan, values, found(git=False))[0]


def test_the_host_reads_commits_only_and_removes_its_clone():
    command = VllmCommit().command("https://x.lan/vllm.git", "79a7108")
    assert "git clone -q --bare --filter=tree:0 -- https://x.lan/vllm.git" in command
    assert "--disambiguate=79a7108" in command and 'rm -rf "$d"' in command
    assert "GIT_TERMINAL_PROMPT=0" in command              # a private URL fails, never prompts
    out = ["git=yes", "fetched=yes", f"commit={FULL}", f"commit={FULL}"]
    assert parse_commits(out) == found(FULL)
    assert parse_commits(["git=no"]) == found(git=False, fetched=False)
    assert parse_commits(["git=yes", "fetched=no", "error=fatal: x"]) == found(fetched=False, error="fatal: x")


# -- the two recipe forms, as the plan says them ----------------------------------------------------

def test_the_plan_names_the_recipe_and_the_full_commit_to_pin(tmp_path):
    plan, facts, values = cmp_host(vllm_git_commit=FULL[:9], vllm_extra_packages=["exllamav3==1.4.8"])
    lines = plan_lines(plan, values, found(FULL))
    assert lines[0] == f"vllm:      a fork at a commit: {FORK['vllm_git_url']} at {FULL}"
    assert lines[1] == (f"vllm:      vllm_git_commit {FULL[:9]} is {FULL} in {FORK['vllm_git_url']} (expanded on "
                        f"the host): pin it: vllm_git_commit: \"{FULL}\"")
    assert lines[2] == "vllm:      extra packages in its virtualenv: exllamav3==1.4.8"
    assert lines[3] == "vllm:      qwen: 1 replica x 4 GPUs (GPU 0-3); waits for the unlocked VRAM"
    patch = tmp_path / "0001-sm80.patch"
    patch.write_text("x\n")
    digest = hashlib.sha256(patch.read_bytes()).hexdigest()
    (tmp_path / "SHA256SUMS").write_text(f"{digest}  0001-sm80.patch\n")
    plan, facts, values = cmp_host(vllm_git_url="https://github.com/vllm-project/vllm.git",
                                   vllm_patches=[str(patch)], vllm_patch_manifest=str(tmp_path / "SHA256SUMS"))
    assert plan_lines(plan, values)[0] == ("vllm:      a base plus a patch series: https://github.com/vllm-project/"
                                           f"vllm.git at {FULL}, then 0001-sm80.patch (sha256 checked)")
    print("\n".join(lines))


def test_a_fork_at_a_commit_is_a_patched_vllm_and_upstream_alone_is_not():
    plan, facts = host("a100")
    glm = {"models": {"glm": dict(GLM, repo="zai-org/GLM-5.3-Flash", size_gib=306.0)},
           "vllm_instances": {"glm": {"model": "glm", "port": 8000, "tp": 8}}}
    assert [r for r in refusals(plan, facts, data(**glm, **FORK)) if r.check == "vllm_cc"] == []
    upstream = {**FORK, "vllm_git_url": "https://github.com/vllm-project/vllm.git"}
    (r,) = only(refusals(plan, facts, data(**glm, **upstream)), "vllm_cc")
    assert "a fork at a commit (vllm_git_url, vllm_git_commit) or a base commit with vllm_patches" in r.fix


# -- extra packages ----------------------------------------------------------------------------------

def test_extra_packages_are_exact_requirements_part_of_the_pin():
    d = {**FORK, "vllm_extra_packages": ["exllamav3==1.4.8", "flashinfer-python[jit]==0.5.3.post1"]}
    the_pin = cmd.pin(d)
    assert the_pin["extra"] == d["vllm_extra_packages"] and the_pin["id"] == f"git-{FULL[:12]}"
    assert "extra" not in cmd.pin(FORK)        # a venv made before the key keeps its stamp
    one, other = cmd.stamp(the_pin, [], d), cmd.stamp(cmd.pin({**d, "vllm_extra_packages": ["exllamav3==1.4.9"]}), [], d)
    assert one != other and json.loads(one)["pin"]["extra"][0] == "exllamav3==1.4.8"
    script = cmd.render("vllm-install.sh.j2", pin_dir="/opt/rigup/vllm/x", pin_label="l", git=FORK["vllm_git_url"],
                        commit=FULL, version=None, patches=[], patch_dir="/p", pip_args=[], python="python3",
                        install_env={}, stamp=one, stamp_name=cmd.STAMP, uv=None, extra=the_pin["extra"])
    assert "\"$target\" exllamav3==1.4.8 'flashinfer-python[jit]==0.5.3.post1'" in script


@pytest.mark.parametrize("item", ["torch>=2.4", "torch", "exllamav3 == 1.4.8", "x==1; os_name=='nt'",
                                  "pkg @ https://evil.lan/x.whl", "--index-url=https://evil.lan", "-e .",
                                  "vllm==0.33.0", "a==1 b==2", "a==$(id)"])
def test_anything_else_in_extra_packages_is_refused_naming_the_item(item):
    with pytest.raises(ConfigError, match=r"^vllm_extra_packages\[1\]: "):
        cmd.pin({**FORK, "vllm_extra_packages": ["exllamav3==1.4.8", item]})


def test_a_package_listed_twice_is_refused():
    with pytest.raises(ConfigError, match=r"exllamav3 is listed twice"):
        cmd.extra_packages({"vllm_extra_packages": ["exllamav3==1.4.8", "ExLlamaV3==1.4.9"]})


# -- a drafter model by name ---------------------------------------------------------------------------

def test_a_drafter_goes_into_the_speculative_config_and_its_marker_is_waited_for():
    spec = {"method": "dflash", "num_speculative_tokens": 7}
    config, problems = instances({"models": {"qwen": QWEN, "drafter": DRAFT},
                                  "vllm_instances": {"q": {"model": "qwen", "port": 8000, "draft_model": "drafter",
                                                           "speculative": spec}}})
    assert problems == []
    args = cmd.argv("q", config["q"], "/v", "/srv/models/qwen", "/srv/models/drafter")
    assert args[-2:] == ["--speculative-config",
                         '{"method":"dflash","model":"/srv/models/drafter","num_speculative_tokens":7}']
    draft = {"path": "/srv/models/drafter", "marker": "/srv/models/drafter/.rigup-complete.json", "sha": "ab" * 32}
    text = cmd.dropin_text("q", config["q"], "/v", "/srv/models/qwen", "/srv/models/qwen/.rigup-complete.json",
                           "u", "s", "e", REV, ["/w"], draft=draft)
    assert "ExecStartPre=/usr/bin/test -r /srv/models/drafter/.rigup-complete.json" in text
    assert f"model {REV}, drafter {'ab' * 6}" in text
    assert '--speculative-config "{\\"method\\":\\"dflash\\",\\"model\\":\\"/srv/models/drafter\\"' in text
    probe = VllmState().command("/opt/rigup/vllm/p", {"q": ["/m/.rigup-complete.json", "q", draft["marker"]]})
    assert f"printf '%s\\n' draft=\"$(sha256sum {draft['marker']}" in probe
    assert parse_state(["@@ q", "draft="])["instances"]["q"]["draft"] is None


@pytest.mark.parametrize("entry, key", [
    ({"draft_model": "drafterr"}, "vllm_instances.q.draft_model"),
    ({"speculative": {"model": "/srv/x"}}, "vllm_instances.q.speculative.model"),
    ({"speculative": {"method": "a\nb"}}, "vllm_instances.q.speculative"),
    ({"speculative": {"bad key": 1}}, "vllm_instances.q.speculative.bad key"),
    ({"extra_args": ["--speculative-config", "{}"]}, "vllm_instances.q.extra_args"),
    ({"extra_args": ["-sc={}"]}, "vllm_instances.q.extra_args"),
])
def test_an_unknown_drafter_or_a_bad_speculative_key_is_refused_naming_it(entry, key):
    _, problems = instances({"models": {"qwen": QWEN, "drafter": DRAFT},
                             "vllm_instances": {"q": {"model": "qwen", "port": 8000, **entry}}})
    assert [k for k, _ in problems] == [key], problems
    print(problems[0])


def test_the_drafter_counts_in_the_vram_check():
    plan, facts = host("cmp170hx")
    d = data(models={"qwen": dict(QWEN, size_gib=59.0), "drafter": dict(DRAFT, size_gib=2.0)}, cmpunlocker_enabled=True,
             vllm_instances={"q": {"model": "qwen", "port": 8000, "gpu_memory_utilization": 0.95,
                                   "draft_model": "drafter"}})
    (r,) = only(refusals(plan, facts, d), "vram")
    assert "weights 61.0 GiB >= 60.8 GiB usable (gpu_memory_utilization 0.95 x 1 x 64.0 GiB" in r.why


# -- serving waits for the unlocked VRAM ------------------------------------------------------------------

def test_serving_waits_while_an_enabled_unlock_has_not_taken():
    plan, facts, values = cmp_host()
    why = unlock_wait(plan, values)
    assert why.startswith("the cards report 8192 MiB (locked): serving waits until they report 65536 MiB, "
                          "after a cold power-off")
    assert plan_lines(plan, values)[-1] == "vllm:      qwen: 1 replica x 4 GPUs (GPU 0-3); waits for the unlocked VRAM"
    (line,) = cmpunlocker.plan_lines(plan, values)
    assert line == f"cmpunlocker: the VRAM checks count 65536 MiB per card (unlocked); {why}"
    assert unlock_wait(plan, {**values, "cmpunlocker_enabled": False}) is None   # stock 8 GB cards serve as they are
    unlocked, _ = host("cmp170hx")
    for card in unlocked["cards"]:
        card["locked"] = False
    assert unlock_wait(unlocked, values) is None and cmpunlocker.plan_lines(unlocked, values) == []
    print(line)


# -- credentials: vllm_netrc_src, never in a URL ---------------------------------------------------

SECRET = "tok-0123456789abcdef"
NETRC_TEXT = f"machine git.example login deploy password {SECRET}\nmachine pypi.example login ci password {SECRET}\n"


def test_a_netrc_of_the_operators_own_is_read_and_reaches_only_a_root_file(tmp_path):
    """vllm_netrc_src: read on the controller (a 0600 file of the operator's), cut to the machines the
    install fetches from (another machine's entry stays behind); the install script names the
    root-only file on the host, never its content; the stamp and the plan neither."""
    src = tmp_path / "netrc"
    src.write_text(NETRC_TEXT + f"machine other.example login me password {SECRET}\n")
    src.chmod(0o600)
    fetched = {"vllm_git_url": "https://git.example/vllm.git", "vllm_pip_args": ["--extra-index-url", "https://pypi.example/simple"]}
    values = {**FORK, **fetched, "vllm_git_commit": FULL, "vllm_netrc_src": str(src)}
    assert cmd.netrc_text(values) == NETRC_TEXT and cmd.netrc_text(FORK) is None
    script = cmd.render("vllm-install.sh.j2", pin_dir="/opt/rigup/vllm/x", pin_label="l", git=FORK["vllm_git_url"],
                        commit=FULL, version=None, patches=[], patch_dir="/p", pip_args=[], python="python3",
                        install_env={}, stamp="s", stamp_name=cmd.STAMP, uv=None, netrc_home=cmd.NETRC_HOME)
    assert "export NETRC=/etc/rigup/vllm-auth/.netrc" in script and "HOME=/etc/rigup/vllm-auth command git" in script
    assert SECRET not in script and SECRET not in cmd.stamp(cmd.pin(values), [], values)
    plan, facts, d = cmp_host(vllm_netrc_src=str(src), **fetched)
    assert [r for r in refusals(plan, facts, d) if r.check == "credentials"] == []
    assert SECRET not in " ".join(plan_lines(plan, d))


@pytest.mark.parametrize("how, why", [
    ("0644", "must be a regular file of yours that no one else may read"),
    ("link", "must be a regular file of yours"),
    ("missing", "cannot be read on the controller"),
    ("garbage", "is not a netrc file (line 1)"),
    ("empty", "names no machine"),
])
def test_a_netrc_that_others_may_read_or_that_is_no_netrc_is_refused_naming_the_key(tmp_path, how, why):
    src = tmp_path / "netrc"
    src.write_text({"garbage": f"machine x login y passwd {SECRET} extra\n", "empty": ""}.get(how, NETRC_TEXT))
    src.chmod(0o644 if how == "0644" else 0o600)
    if how == "link":
        (tmp_path / "l").symlink_to(src)
        src = tmp_path / "l"
    if how == "missing":
        src = tmp_path / "none"
    plan, facts, d = cmp_host(vllm_netrc_src=str(src))
    (r,) = only(refusals(plan, facts, d), "credentials")
    print(r.line("rig-01"))
    assert r.what == "vllm_netrc_src" and why in r.why and SECRET not in r.line("rig-01")
