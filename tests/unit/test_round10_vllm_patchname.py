"""Round 10, V1: a vLLM patch's file name reaches vllm-install.sh (run as root) only shell-quoted:
``fix$(id>&2).patch`` is printed as it is, never run."""

import subprocess

from roles.vllm import command as cmd

SHA = "0123456789abcdef0123456789abcdef01234567"
NAMES = ["fix$(id>&2).patch", "a`id`.patch", "it's \"x\".patch", "0001-fix-moe.patch"]


def script(name: str) -> str:
    return cmd.render("vllm-install.sh.j2", pin_dir="/opt/rigup/vllm/x", pin_label="l", git="https://h/vllm.git",
                      commit=SHA, version=None, patches=[{"name": name, "sha256": "a" * 64, "text": ""}],
                      patch_dir="/opt/rigup/vllm/patches", pip_args=[], python="python3", install_env={},
                      stamp="s", stamp_name=cmd.STAMP, uv=None)


def test_a_patch_name_is_quoted_in_the_install_script():
    for name in NAMES:
        text = script(name)
        lines = [ln.strip() for ln in text.splitlines()
                 if ln.startswith("name=") or ln.strip().startswith('echo "rigup-vllm: ') and "$name" in ln]
        assert len(lines) == 4 and name not in "\n".join(lines[1:]), lines
        ran = subprocess.run(["bash", "-c", "; ".join(ln.removesuffix(" >&2") for ln in lines)],
                             capture_output=True, text=True)
        print(f"{name!r}: bash printed {ran.stdout.splitlines()!r}, stderr {ran.stderr!r}")
        assert ran.returncode == 0 and ran.stderr == ""
        assert ran.stdout.splitlines() == [f"rigup-vllm: applied {name}", f"rigup-vllm: {name} is already applied",
                                           f"rigup-vllm: patch {name} does not apply to {SHA}: refused, nothing changed"]
