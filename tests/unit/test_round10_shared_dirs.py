"""Round 10, H1: a directory rigup makes on a host as root (a [path] key: rigup_prefix,
rigup_state_dir, llama_cpp_dir, ...) is refused under a directory every user can write (/tmp,
/var/tmp, /dev/shm, /run/lock, /var/lock), naming the key: another user could make it first."""

import pytest

from rigup.config import declared, problems

PATH_KEYS = sorted(name for name, var in declared().items() if var.form.kind == "path")


@pytest.mark.parametrize("key", PATH_KEYS)
@pytest.mark.parametrize("path", ["/tmp/rigup", "/var/tmp/rigup", "/tmp/a/b/c", "/dev/shm/x", "/run/lock/r",
                                  "/var/lock/r"])
def test_a_directory_under_a_shared_one_is_refused(key, path):
    found = problems({key: path})
    print(f"{key}={path}: {found}")
    assert len(found) == 1 and found[0][0] == key and found[0][1].startswith(f"{key}: expected path")


@pytest.mark.parametrize("path", ["/opt/rigup", "/srv/tmp/rigup", "/var/lib/tmp", "/tmpfs/rigup", "/data/var/tmp/x"])
def test_other_directories_pass(path):
    found = problems({"rigup_prefix": path})
    print(f"rigup_prefix={path}: {found}")
    assert found == []
