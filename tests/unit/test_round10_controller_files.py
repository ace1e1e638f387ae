"""Round 10, AR1: a controller file named by configuration that root builds or installs on every
host (llama_cpp_archive and the other [file] keys; vllm_patches and vllm_patch_manifest) is used
only when no other user could have written it or a directory on its path (rigup.boundary.owned's
rule, OpenSSH's StrictModes), refused naming the key."""

import hashlib
import os

import pytest
from hypothesis import given, settings, strategies as st

from rigup.config import ConfigError, declared, file_problem, problems
from roles.vllm import command as cmd

SHA = "0123456789abcdef0123456789abcdef01234567"
FILE_KEYS = sorted(name for name, var in declared().items() if var.form.kind == "file")
NOBODY = 65534


def archive(tmp_path, mode=0o644, dir_mode=0o755):
    d = tmp_path / "d"
    d.mkdir(exist_ok=True)
    d.chmod(dir_mode)
    f = d / "llama.tar.gz"
    f.write_bytes(b"\x1f\x8b not text")
    f.chmod(mode)
    return f


def test_the_file_keys_are_those_expected():
    print("[file] keys:", FILE_KEYS)
    assert "llama_cpp_archive" in FILE_KEYS and "cmpunlocker_archive" in FILE_KEYS


@pytest.mark.parametrize("key", FILE_KEYS)
def test_a_file_others_can_write_is_refused_naming_the_key(key, tmp_path):
    for mode, dir_mode, said in ((0o666, 0o755, "writable by others"), (0o644, 0o777, "the directory"),
                                 (0o644, 0o1777, None)):   # sticky: your own file there is yours alone
        f = archive(tmp_path, mode, dir_mode)
        found = problems({key: str(f)})
        print(f"{key}: file {oct(mode)} in a directory {oct(dir_mode)}: {found}")
        if said is None:
            assert found == []
        else:
            assert len(found) == 1 and found[0][0] == key and said in found[0][1]


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_archive_in_a_sticky_directory_is_refused(tmp_path):
    f = archive(tmp_path, 0o644, 0o1777)
    os.chown(f, NOBODY, NOBODY)
    found = problems({"llama_cpp_archive": str(f)})
    print("nobody's archive in a 1777 directory:", found)
    assert found and "is owned by" in found[0][1] and found[0][1].startswith("llama_cpp_archive: ")


def test_a_link_is_refused_and_a_missing_file_left_to_its_reader(tmp_path):
    f = archive(tmp_path)
    (tmp_path / "link").symlink_to(f)
    print("link:", file_problem(str(tmp_path / "link")), "| missing:", file_problem(str(tmp_path / "none")),
          "| yours:", file_problem(str(f)))
    assert "symbolic link" in file_problem(str(tmp_path / "link"))
    assert file_problem(str(tmp_path / "none")) is None and file_problem(str(f)) is None
    assert "no regular file" in file_problem(str(tmp_path))


@settings(max_examples=60, deadline=None)
@given(mode=st.integers(0o400, 0o777))
def test_a_files_mode_decides(mode, tmp_path_factory):
    f = archive(tmp_path_factory.mktemp("m"), mode | 0o400)
    why = file_problem(str(f))
    if mode & 0o002:
        assert why and "writable by others" in why
    if not mode & 0o022:
        assert why is None


@pytest.fixture
def series(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "0001-a.patch").write_text("a\n")
    manifest = d / "SHA256SUMS"
    manifest.write_text(hashlib.sha256(b"a\n").hexdigest() + "  0001-a.patch\n")
    return {"vllm_git_url": "https://x/vllm.git", "vllm_git_commit": SHA, "vllm_patches": [str(d / "0001-a.patch")],
            "vllm_patch_manifest": str(manifest)}


def test_vllm_patches_and_manifest_others_can_write_are_refused(series):
    assert [p["name"] for p in cmd.patches(series)] == ["0001-a.patch"]
    for key, path in (("vllm_patches[0]", series["vllm_patches"][0]), ("vllm_patch_manifest", series["vllm_patch_manifest"])):
        os.chmod(path, 0o666)
        with pytest.raises(ConfigError) as e:
            cmd.patches(series)
        print(f"{key} mode 0666: {e.value}")
        assert str(e.value).startswith(f"{key}: ") and "writable by others" in str(e.value)
        os.chmod(path, 0o644)
    os.chmod(os.path.dirname(series["vllm_patch_manifest"]), 0o777)
    with pytest.raises(ConfigError) as e:
        cmd.patches(series)
    print("the patches' directory 0777:", e.value)
    assert "the directory" in str(e.value)


def test_a_missing_manifest_says_so(series):
    with pytest.raises(ConfigError, match=r"^vllm_patch_manifest: cannot read .*: No such file"):
        cmd.patches({**series, "vllm_patch_manifest": series["vllm_patch_manifest"] + ".gone"})


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_build_id_refuses_another_users_archive(tmp_path):
    from roles.llama_cpp import script
    f = archive(tmp_path, 0o644, 0o1777)
    data = {"llama_cpp_archive": str(f), "llama_cpp_ref": "b8779", "llama_cpp_source": "x", "llama_cpp_targets": []}
    mine = script.build_id(data, [])
    os.chown(f, NOBODY, NOBODY)
    with pytest.raises(ConfigError) as e:
        script.build_id(data, [])
    print(f"your archive: {mine}; nobody's: {e.value}")
    assert str(e.value).startswith("llama_cpp_archive: ") and "owned by nobody" in str(e.value)
