"""issue 47: pyinfra's uploads for ``_sudo`` go through a temporary name in a directory only the
login user can write (config.py TEMP_DIR: its home), never a predictable /tmp/pyinfra-<sha1>.
pyinfra itself, run from the checkout as every play is."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sudo_uploads_go_through_the_login_users_home(tmp_path):
    play = tmp_path / "where.py"
    play.write_text("from pyinfra import host\n"
                    "print('TEMP', host.get_temp_filename('/etc/rigup/x'), host.get_temp_dir_config())\n")
    run = subprocess.run([str(Path(sys.executable).with_name("pyinfra")), "-y", "@local", str(play)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("TEMP "))
    print(line)
    _, upload, askpass_dir = line.split()
    assert upload.startswith("./pyinfra-") and askpass_dir == "."
