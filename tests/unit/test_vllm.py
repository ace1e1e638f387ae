"""roles/vllm without a host: pin, patch manifest, partition, environment, command line, unit."""

import hashlib
import json
import re

import pytest

from rigup.config import ConfigError, group_vars, role_defaults
from roles.vllm import command as cmd
from roles.vllm.facts import parse_state
from rigup.instances.vllm import instances

SHA = "0123456789abcdef0123456789abcdef01234567"
MODELS = {"glm": {"repo": "org/some-model", "revision": SHA}}


def inst(**kw):
    config, problems = instances({"models": MODELS, "vllm_instances": {"a": {"model": "glm", "port": 8000, **kw}}})
    assert problems == []
    return config["a"]


def problems_of(**kw):
    _, problems = instances({"models": MODELS, "vllm_instances": {"a": {"model": "glm", "port": 8000, **kw}}})
    return problems


# -- pin ---------------------------------------------------------------------------------------

def test_pip_pin_and_git_pin():
    assert cmd.pin({"vllm_pip_version": "0.33.0"}) == {"pip": "0.33.0", "id": "pip-0.33.0"}
    assert cmd.pin({"vllm_git_url": "https://x/vllm.git", "vllm_git_commit": SHA}) == \
        {"git": "https://x/vllm.git", "commit": SHA, "id": f"git-{SHA[:12]}"}


@pytest.mark.parametrize("data, key", [
    ({}, "vllm_pip_version"),
    ({"vllm_pip_version": ">=0.33"}, "vllm_pip_version"),
    ({"vllm_pip_version": "latest"}, "vllm_pip_version"),
    ({"vllm_git_url": "https://x/vllm.git"}, "vllm_git_commit"),
    ({"vllm_git_url": "https://x/vllm.git", "vllm_git_commit": "main"}, "vllm_git_commit"),
    ({"vllm_git_url": "https://x/vllm.git", "vllm_git_commit": SHA[:12]}, "vllm_git_commit"),
    ({"vllm_git_url": "https://x/vllm.git", "vllm_git_commit": SHA.upper()}, "vllm_git_commit"),
    ({"vllm_git_commit": SHA}, "vllm_git_commit"),
    ({"vllm_git_url": "u", "vllm_git_commit": SHA, "vllm_pip_version": "0.33.0"}, "vllm_pip_version"),
])
def test_anything_else_is_refused_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=f"^{key}: "):
        cmd.pin(data)


# -- patches -----------------------------------------------------------------------------------

@pytest.fixture
def series(tmp_path):
    files = []
    for name, text in (("0001-a.patch", "a\n"), ("0002-b.patch", "b\n")):
        (tmp_path / name).write_text(text)
        files.append(tmp_path / name)
    manifest = tmp_path / "SHA256SUMS"
    manifest.write_text("".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.name}\n" for f in files))
    return {"vllm_git_url": "https://x/vllm.git", "vllm_git_commit": SHA, "vllm_patches": [str(f) for f in files],
            "vllm_patch_manifest": str(manifest)}


def test_series_in_order_with_hashes(series):
    got = cmd.patches(series)
    assert [p["name"] for p in got] == ["0001-a.patch", "0002-b.patch"]
    assert got[0]["sha256"] == hashlib.sha256(b"a\n").hexdigest()


def test_a_sha256_mismatch_is_refused(series, tmp_path):
    (tmp_path / "0002-b.patch").write_text("b changed\n")
    with pytest.raises(ConfigError, match=r"vllm_patches\[1\]: 0002-b.patch has sha256 .* but the manifest"):
        cmd.patches(series)


def test_a_patch_missing_from_the_manifest_or_without_one_is_refused(series, tmp_path):
    (tmp_path / "SHA256SUMS").write_text((tmp_path / "SHA256SUMS").read_text().splitlines()[0] + "\n")
    with pytest.raises(ConfigError, match=r"0002-b.patch is not in the manifest"):
        cmd.patches(series)
    with pytest.raises(ConfigError, match="^vllm_patch_manifest: required"):
        cmd.patches({**series, "vllm_patch_manifest": None})


def test_patches_need_a_git_pin(series):
    with pytest.raises(ConfigError, match="^vllm_patches: a patch series needs a git checkout"):
        cmd.patches({**series, "vllm_git_url": None, "vllm_pip_version": "0.33.0"})


def test_stamp_changes_with_the_pin_or_a_patch(series):
    pin = cmd.pin(series)
    one = cmd.stamp(pin, cmd.patches(series), series)
    assert one == cmd.stamp(pin, cmd.patches(series), series)
    assert one != cmd.stamp(pin, cmd.patches(series)[:1], series)
    assert one != cmd.stamp(cmd.pin({**series, "vllm_git_commit": "f" * 40}), cmd.patches(series), series)
    assert json.loads(one)["patches"][0][0] == "0001-a.patch"


# -- partition (preflight's schema, then the role again) -----------------------------------------

def test_a_good_partition_is_written_to_the_env_file():
    i = inst(pp=4, pp_partition="13, 11,11,10", layers=45)
    env = cmd.env_vars("a", i, role_defaults("vllm"), {})
    assert env["VLLM_PP_LAYER_PARTITION"] == "13,11,11,10"
    assert 'VLLM_PP_LAYER_PARTITION="13,11,11,10"' in cmd.env_text("a", env)


@pytest.mark.parametrize("kw, message", [
    ({"pp": 3, "pp_partition": "13,11,11,10"}, "4 stages in '13,11,11,10', but pp is 3"),
    ({"pp": 2, "pp_partition": "20,12", "layers": 30}, "'20,12' sums to 32 layers, but the model has 30"),
    ({"pp": 2, "pp_partition": "20,x"}, "expected layer counts separated by commas"),
    ({"pp": 2, "pp_partition": "32,0"}, "has no layers"),
])
def test_a_bad_partition_is_refused(kw, message):
    found = problems_of(**kw)
    assert [p for p in found if p[0] == "vllm_instances.a.pp_partition" and message in p[1]], found
    with pytest.raises(ConfigError, match=re.escape(message)):
        cmd.partition({"tp": 1, "pp": 1, "layers": None, **kw})


def test_gpus_count_and_env_keys_are_checked():
    assert problems_of(tp=2, gpus="0,1,2")[0][0] == "vllm_instances.a.gpus"
    assert problems_of(env={"BAD NAME": "x"})[0][0] == "vllm_instances.a.env.BAD NAME"
    assert problems_of(tp=2, gpus="2,3") == []


# -- environment ---------------------------------------------------------------------------------

def test_env_has_home_caches_and_nccl_knobs():
    env = cmd.env_vars("a", inst(gpus="0"), {**role_defaults("vllm"), "vllm_socket_ifname": "eth1",
                                              "vllm_env": {"VLLM_X": 1, "DEBUG": True}}, {"card_classes": ["a100"]})
    assert env["HOME"] == "/var/lib/rigup/vllm/a" and env["HF_HOME"] == "/var/cache/rigup/vllm/a/hf"
    assert env["NCCL_NVLS_ENABLE"] == "0" and "NCCL_P2P_DISABLE" not in env
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["VLLM_X"] == "1" and env["DEBUG"] == "1"


def test_p2p_off_on_cmp_rigs_unless_told():
    defaults = role_defaults("vllm")
    assert cmd.env_vars("a", inst(), defaults, {"card_classes": ["cmp170hx"]})["NCCL_P2P_DISABLE"] == "1"
    assert "NCCL_P2P_DISABLE" not in cmd.env_vars("a", inst(), {**defaults, "vllm_nccl_p2p_disable": False},
                                                  {"card_classes": ["cmp170hx"]})
    assert cmd.env_vars("a", inst(), {**defaults, "vllm_nccl_p2p_disable": True}, {})["NCCL_P2P_DISABLE"] == "1"


def test_env_text_quotes_for_systemd():
    assert cmd.env_text("a", {"X": 'say "hi" \\ $HOME'}).splitlines()[1] == 'X="say \\"hi\\" \\\\ $HOME"'


# -- command line, drop-in, unit -----------------------------------------------------------------

def test_argv_is_explicit():
    args = cmd.argv("glm", inst(tp=2, pp=2, extra_args=["--max-model-len", "32k"]), "/opt/rigup/vllm/p/venv", "/srv/m")
    assert args == ["/opt/rigup/vllm/p/venv/bin/vllm", "serve", "/srv/m", "--host", "127.0.0.1", "--port", "8000",
                    "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2", "--gpu-memory-utilization", "0.9",
                    "--served-model-name", "glm", "--max-model-len", "32k"]


def test_dropin_names_what_restarts_it():
    text = cmd.dropin_text("glm", inst(), "/v", "/srv/m", "/srv/m/.rigup-complete.json", "u1", "s1", "e1", SHA,
                           ["/opt/rigup/vllm/bin/rigup-vllm-wait-vram", "1024", "300"])
    assert "unit u1, vllm install s1, environment e1, model " + SHA in text
    assert "EnvironmentFile=/etc/rigup/vllm/glm.env" in text
    assert "ExecStartPre=/usr/bin/test -r /srv/m/.rigup-complete.json" in text
    assert "ExecStartPre=+/opt/rigup/vllm/bin/rigup-vllm-wait-vram 1024 300" in text
    assert "ExecStart=\nExecStart=/v/bin/vllm serve /srv/m --host 127.0.0.1" in text


def test_unit_settings():
    unit = cmd.render("vllm-unit.service.j2", user="rigup", guard_file="/var/lib/rigup/gpu-guard.tripped",
                      start_timeout=900, stop_timeout=120, restart_sec=30)
    for line in ("KillMode=control-group", "KillSignal=SIGINT", "TimeoutStartSec=900", "TimeoutStopSec=120",
                 "RestartSec=30", "StartLimitBurst=4", "User=rigup", "After=network-online.target "
                 "nvidia-persistenced.service rigup-gpu-power.service",
                 "ConditionPathExists=!/var/lib/rigup/gpu-guard.tripped", "ProtectSystem=strict",
                 "NoNewPrivileges=yes"):
        assert line in unit.splitlines(), line


def test_install_script_checks_each_patch_before_applying(series):
    pin, got = cmd.pin(series), cmd.patches(series)
    script = cmd.render("vllm-install.sh.j2", pin_dir="/opt/rigup/vllm/x", pin_label="l", git="u", commit=SHA,
                        version=None, patches=got, patch_dir="/opt/rigup/vllm/patches", pip_args=["--no-index"],
                        python="python3", install_env={"VLLM_USE_PRECOMPILED": "1"},
                        stamp=cmd.stamp(pin, got, series), stamp_name=cmd.STAMP, uv=None)
    assert script.index("apply --check") < script.index('rm -rf "$pin_dir/src"') < script.index("-m venv")
    assert script.count("apply --check \"$patch\"") == 2 and "export VLLM_USE_PRECOMPILED=1" in script


def pip_script(**data):
    """The install script of a PyPI pin with ``data`` (vllm_installer, vllm_uv_version...)."""
    data = {"vllm_pip_version": "0.33.0", "vllm_dir": "/opt/rigup/vllm", **data}
    return cmd.render("vllm-install.sh.j2", pin_dir="/opt/rigup/vllm/pip-0.33.0", pin_label="l", git=None,
                      commit=None, version="0.33.0", patches=[], patch_dir="/opt/rigup/vllm/patches",
                      pip_args=["--extra-index-url", "https://x/simple?a b"], python="python3", install_env={},
                      stamp=cmd.stamp(cmd.pin(data), [], data), stamp_name=cmd.STAMP, uv=cmd.uv(data))


def test_uv_installs_with_its_pinned_uv_and_pip_does_not():
    script = pip_script(vllm_installer="uv", vllm_uv_version="0.9.7")
    assert "install --disable-pip-version-check --no-input -q uv==0.9.7" in script
    assert "uv=/opt/rigup/vllm/uv-0.9.7/bin/uv" in script and "rm -rf /opt/rigup/vllm/uv-0.9.7" in script
    assert ('"$uv" pip install --python "$pin_dir/venv/bin/python" --extra-index-url '
            "'https://x/simple?a b' \"$target\"") in script and "target=vllm==0.33.0" in script
    assert 'export TMPDIR="$stage/tmp"' in script   # not a small tmpfs /tmp
    assert "venv/bin/pip\" install" not in script and script.index("-m venv \"$pin_dir/venv\"") < script.index('"$uv" pip')
    plain = pip_script()
    assert "uv" not in plain.replace("vllm", "")
    assert '"$pin_dir/venv/bin/pip" install --disable-pip-version-check --no-input --progress-bar off --extra-index-url' in plain


def test_the_stamp_names_uv_and_its_version_and_a_pip_stamp_is_as_before():
    data = {"vllm_pip_version": "0.33.0"}
    pip_stamp = json.loads(cmd.stamp(cmd.pin(data), [], data))
    assert "installer" not in pip_stamp   # a pip venv made before the key keeps its stamp
    uv_stamp = json.loads(cmd.stamp(cmd.pin(data), [], {**data, "vllm_installer": "uv", "vllm_uv_version": "0.9.7"}))
    assert uv_stamp == {**pip_stamp, "installer": "uv==0.9.7"}
    assert cmd.uv({"vllm_installer": "uv", "vllm_uv_version": "0.9.8", "vllm_dir": "/v/"}) == \
        {"version": "0.9.8", "dir": "/v/uv-0.9.8"}


@pytest.mark.parametrize("version", [None, "", ">=0.9", "latest 1"])
def test_uv_must_be_pinned(version):
    with pytest.raises(ConfigError, match="^vllm_uv_version: "):
        cmd.uv({"vllm_installer": "uv", "vllm_uv_version": version})


def test_state_parses():
    state = parse_state(['stamp={"pin": 1}', "@@ a", "dropin=ab", "env=", "active=active", "enabled=enabled",
                         'marker={"revision": "r"}'])
    assert state == {"stamp": '{"pin": 1}', "units": [], "backends": [], "instances": {"a": {"dropin": "ab", "env": None, "active": "active",
                                                                "enabled": "enabled", "marker": {"revision": "r"}}}}


def test_group_vars_still_validate():
    assert group_vars("all") is not None
