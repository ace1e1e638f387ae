"""Host facts of the fifth re-round (issue 61): the nvcc run is the one checked (N22)."""

from __future__ import annotations

import os
import subprocess
import sys

from rigup.gpu.facts import CUDA_COMMAND, parse_cuda_toolkits

# Flips argv[1] between /usr/bin/true (root's: passes the walk) and argv[2] until killed.
FLIP = """import os, sys
link, evil = sys.argv[1:]
for i in range(10**9):
    tmp = f"{link}.{i % 2}"
    try: os.unlink(tmp)
    except FileNotFoundError: pass
    os.symlink("/usr/bin/true" if i % 2 == 0 else evil, tmp)
    os.replace(tmp, link)
"""


def test_the_nvcc_run_is_the_real_path_checked_not_the_name_read_again(tmp_path):
    """N22: ``$n``, a link in a directory another user writes, flipped between a root-owned program (for
    the check) and the user's script (for the run): the script ran 41 times in 300 gatherings."""
    mark, evil, link = tmp_path / "ran", tmp_path / "evil", tmp_path / "bin" / "nvcc"
    link.parent.mkdir()
    evil.write_text(f"#!/bin/sh\necho ran >> {mark}\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    evil.chmod(0o755)
    flipper = subprocess.Popen([sys.executable, "-c", FLIP, str(link), str(evil)])
    try:
        env = {**os.environ, "PATH": f"{link.parent}:/usr/bin:/bin"}
        for _ in range(200):
            out = subprocess.run(["sh", "-c", CUDA_COMMAND], capture_output=True, text=True, timeout=60,
                                 env=env).stdout.splitlines()
            assert all(t["path"] != str(evil) for t in parse_cuda_toolkits(out))
    finally:
        flipper.kill()
        flipper.wait()
    runs = mark.read_text().count("ran") if mark.exists() else 0
    print(f"the link's other target ran {runs} times in 200 gatherings")
    assert runs == 0
    # the race is timing's; the text is not: the program run is the path the walk read
    assert '"$r" --version' in CUDA_COMMAND and '"$n" --version' not in CUDA_COMMAND
