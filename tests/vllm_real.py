"""`make vllm-real`: a real vLLM installed by roles/vllm on a lab host (issues 19 and 18).

Not part of `make test`: it fetches several GB from PyPI through the lab's proxy (vLLM pulls torch
with CUDA). On one fresh a100 lab host (no GPU: the role's install runs `vllm --version`, which
needs none), with the play tests/roles/vllm_only.py and an instance whose model is absent (the
install runs, the instance waits, nothing is served):

1. vLLM ``VERSION`` from PyPI, once with pip and once with uv (caches emptied before each): wall
   time of the converge, venv size, cache size; a second converge changes nothing.
2. The seeds' patched path: the sdist and the wheel of that version fetched on the host through
   the proxy, a git repository made there from the sdist, one Python-only patch (made there,
   brought to the controller as a series with its sha256 manifest), installed by the faster
   installer with ``VLLM_USE_PRECOMPILED=1`` and ``VLLM_PRECOMPILED_WHEEL_LOCATION`` the local
   wheel (vLLM's setup.py takes the compiled parts from it: no CUDA compile). Checked: the version
   runs in the venv, the patched file is in it, the stamp is the role's, a second converge
   changes nothing.

Prints a table and writes tests/bench/results/<date>-vllm-real-install.{md,json} (arguments: the
installers to run, pip and/or uv; --no-patched: the installs alone, written apart). Tears the lab
down at the end (run it with your RIGUP_LAB_ID).
"""

import hashlib
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from rigup import config
from roles.vllm import command as cmd
from tests.converge import ROOT, pyinfra
from tests.lab import lab

VERSION = "0.33.0"           # vLLM on PyPI: cp38-abi3 manylinux_2_28 wheel, requires Python >=3.11,<3.15
UV = "0.13.9"
PLAY = "tests/roles/vllm_only.py"
DIST = "/root/vllm-dist"     # the sdist and wheel, fetched on the host
REPO = "/root/vllm-src.git"  # the git repository made there from the sdist
MODEL = "/srv/models/vllm-real-absent"
PATCH = "0001-rigup-lab-marker.patch"
MARK = 'RIGUP_LAB_PATCH = "0001"'
RESULTS = ROOT / "tests/bench/results"


def sh(host: str, command: str, timeout: int = 1800) -> str:
    """stdout of ``command`` on the lab host; raises with its output when it fails."""
    result = lab.ssh(host, command, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{host}: {command!r} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return result.stdout


def values(installer: str, **over) -> dict:
    """The play's data: an instance whose model never arrives, vLLM pinned, the lab's proxy and CA
    given to the install (uv reads no pip.conf)."""
    lab_vars = config.load_yaml(config.GROUP_VARS_DIR / "lab.yml")
    proxy = lab.PROXY
    return {"models": {**lab_vars["models"], "real": {"repo": "rigup-lab/absent", "revision": "2" * 40,
                                                      "dest": MODEL}},
            "vllm_instances": {"real": {"model": "real", "port": 8096}},
            "vllm_pip_version": VERSION, "vllm_installer": installer, "vllm_uv_version": UV,
            "vllm_install_env": {"HTTPS_PROXY": proxy, "SSL_CERT_FILE": "/etc/rigup-lab/ca.crt"}, **over}


def play(host: str, data: dict):
    args = [a for k, v in data.items() for a in ("--data", f"{k}={json.dumps(v)}")]
    run = pyinfra("inventory/lab.py", PLAY, "--limit", host, *args, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(f"converge failed:\n{run.output[-6000:]}")
    return run


def du(host: str, *paths: str) -> int:
    """Bytes under ``paths`` on the host (0 for those absent)."""
    quoted = " ".join(shlex.quote(p) for p in paths)
    out = sh(host, f"du -scb {quoted} 2>/dev/null | tail -1 || true")
    return int(out.split()[0]) if out.strip() else 0


def version_of(host: str, venv: str) -> dict:
    """vLLM's version, imported in the venv, timed (``vllm --version`` fails without a GPU in 0.33:
    "RuntimeError: Failed to infer device type", from building its CLI)."""
    start = time.monotonic()
    out = sh(host, f"{shlex.quote(venv)}/bin/python -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1")
    return {"vllm_version": out.strip(), "version_s": round(time.monotonic() - start, 1)}


def install(host: str, installer: str) -> dict:
    """The PyPI pin installed by ``installer`` from empty caches, then converged again."""
    sh(host, "rm -rf /root/.cache/pip /root/.cache/uv /opt/rigup/vllm/pip-* /opt/rigup/vllm/uv-*")
    first = play(host, values(installer))
    again = play(host, values(installer))
    venv = f"/opt/rigup/vllm/pip-{VERSION}/venv"
    row = {"what": f"vllm=={VERSION} from PyPI, {installer}" + (f" {UV}" if installer == "uv" else "")
           + " (cold cache)", "installer": installer, "converge_s": round(first.seconds, 1),
           "again_s": round(again.seconds, 1), "again_changed": again.totals["changed"],
           "venv_bytes": du(host, venv), "cache_bytes": du(host, "/root/.cache/pip", "/root/.cache/uv"),
           "uv_dir_bytes": du(host, f"/opt/rigup/vllm/uv-{UV}"), **version_of(host, venv),
           "packages": int(sh(host, f"{venv}/bin/python -m pip list 2>/dev/null | tail -n +3 | wc -l"))}
    assert VERSION in row["vllm_version"], row
    assert "vllm virtualenv" in " ".join(first.changed_operations()), first.changed_operations()
    assert row["again_changed"] == 0, again.changed_operations()
    return row


def sources(host: str) -> dict:
    """The sdist and wheel fetched on the host through the lab's proxy (pip download for the wheel,
    the simple index for the sdist: `pip download --no-binary` would build torch from source to
    read its metadata), a git repository made from the sdist, and the patch made there."""
    ca = "--cacert /etc/rigup-lab/ca.crt"
    start = time.monotonic()
    sh(host, f"mkdir -p {DIST} && cd {DIST} && python3 -m venv /root/dl && "
             f"/root/dl/bin/pip download -q --no-cache-dir --no-deps vllm=={VERSION} -d . && "
             f"curl -sSf {ca} -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/vllm/ "
             f"| python3 -c 'import json,sys; print(next(f[\"url\"] for f in json.load(sys.stdin)[\"files\"] "
             f"if f[\"filename\"] == \"vllm-{VERSION}.tar.gz\"))' > sdist.url && "
             f"curl -sSf {ca} -o vllm-{VERSION}.tar.gz \"$(cat sdist.url)\"")
    fetched = time.monotonic() - start
    wheel = sh(host, f"ls {DIST}/vllm-{VERSION}-*x86_64.whl").strip()
    work = "/root/vllm-work"
    git = "git -c user.name=rigup-lab -c user.email=lab@rigup.invalid"
    sh(host, f"rm -rf {work} {REPO} && mkdir -p {work} && tar xzf {DIST}/vllm-{VERSION}.tar.gz -C {work} "
             f"--strip-components=1 && cd {work} && git init -q && git add -A && "
             f"{git} commit -qm 'vllm {VERSION} (sdist from PyPI)' && git clone -q --bare . {REPO}")
    commit = sh(host, f"git -C {work} rev-parse HEAD").strip()
    sh(host, f"cd {work} && printf '\\n# rigup lab: a Python-only patch, installed over the precompiled wheel\\n"
             f"{MARK}\\n' >> vllm/envs.py && git diff > /root/{PATCH} && git checkout -q .")
    return {"commit": commit, "wheel": wheel, "patch": sh(host, f"cat /root/{PATCH}"),
            "sdist_bytes": du(host, f"{DIST}/vllm-{VERSION}.tar.gz"), "wheel_bytes": du(host, wheel),
            "fetch_s": round(fetched, 1), "repo_bytes": du(host, REPO)}


def patched(host: str, installer: str, src: dict, tmp: Path) -> dict:
    """The git pin with the one-patch series, Python-only over the precompiled wheel."""
    (tmp / PATCH).write_text(src["patch"])
    digest = hashlib.sha256((tmp / PATCH).read_bytes()).hexdigest()
    (tmp / "SHA256SUMS").write_text(f"{digest}  {PATCH}\n")
    data = values(installer, vllm_pip_version=None, vllm_git_url=f"file://{REPO}", vllm_git_commit=src["commit"],
                  vllm_patches=[str(tmp / PATCH)], vllm_patch_manifest=str(tmp / "SHA256SUMS"))
    data["vllm_install_env"] = {**data["vllm_install_env"], "VLLM_USE_PRECOMPILED": "1",
                                "VLLM_PRECOMPILED_WHEEL_LOCATION": src["wheel"],
                                "VLLM_VERSION_OVERRIDE": f"{VERSION}+rigup.lab"}
    first = play(host, data)
    again = play(host, data)
    the_pin = cmd.pin(data)
    pin_dir = f"/opt/rigup/vllm/{the_pin['id']}"
    venv = f"{pin_dir}/venv"
    want = cmd.stamp(the_pin, cmd.patches(data), {**config.role_defaults("vllm"), **data})
    site = sh(host, f"{venv}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])'").strip()
    row = {"what": f"git {REPO} (sdist {VERSION}) + 1 patch, VLLM_USE_PRECOMPILED=1 from the local wheel, "
                   f"{installer}", "installer": installer, "converge_s": round(first.seconds, 1),
           "again_s": round(again.seconds, 1), "again_changed": again.totals["changed"],
           "venv_bytes": du(host, venv), "cache_bytes": du(host, "/root/.cache/pip", "/root/.cache/uv"),
           **version_of(host, venv),
           "patched_in_venv": sh(host, f"grep -c {shlex.quote(MARK)} {site}/vllm/envs.py").strip() == "1",
           "compiled_so_files": int(sh(host, f"find {site}/vllm -name '*.so' | wc -l")),
           "stamp_is_the_roles": sh(host, f"cat {pin_dir}/{cmd.STAMP}") == want,
           "patch_sha256": digest}
    assert VERSION in row["vllm_version"] and row["patched_in_venv"] and row["stamp_is_the_roles"], row
    assert row["again_changed"] == 0, again.changed_operations()
    return row


def write(rows: list[dict], src: dict, python: str, notes: tuple = (), name: str = "") -> None:
    """The results, Markdown and JSON, under tests/bench/results (``notes``: paragraphs added;
    ``name``: a suffix, for the installs alone)."""
    day = time.strftime("%Y-%m-%d")
    base = RESULTS / f"{day}-vllm-real-install{'-' + name if name else ''}"
    doc = {"vllm": VERSION, "uv": UV, "host": f"lab host (Debian 12, {python}, no GPU), PyPI via the lab's proxy",
           "sources": {k: v for k, v in src.items() if k != "patch"}, "rows": rows, "notes": list(notes)}
    base.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    gib = 1024 ** 3
    lines = [f"# A real vLLM {VERSION} installed by roles/vllm on a lab host ({day}, `make vllm-real`)", "",
             f"{doc['host']}; this machine: 2 cores. Converge = the whole play (preflight, base, vllm) "
             "with pyinfra over SSH; the second converge of each changed nothing.", "",
             "| install | converge s | again s | venv GiB | cache GiB | `import vllm`: version (s) |",
             "|---|---:|---:|---:|---:|---|"]
    def size(n):
        return "?" if n is None else f"{n / gib:.2f}"
    lines += [f"| {r['what']} | {r['converge_s']} | {r['again_s'] or '?'} | {size(r['venv_bytes'])} | "
              f"{size(r['cache_bytes'])} | {r['vllm_version']} ({r['version_s'] or '?'}) |" for r in rows]
    lines += [f"\n{n}" for n in doc.get("notes", [])]
    if src:
        lines += ["", f"Sources fetched on the host: sdist {src['sdist_bytes'] / 2**20:.0f} MiB and wheel "
                  f"{src['wheel_bytes'] / 2**20:.0f} MiB in {src['fetch_s']} s; git repository from the sdist "
                  f"{src['repo_bytes'] / 2**20:.0f} MiB.", ""]
    base.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines), flush=True)


def main() -> None:
    lab.down()
    rows, src = [], {}
    try:
        lab.up(1, "a100")
        host = lab.hosts()[0]["name"]
        python = sh(host, "python3 --version").strip()
        installers = [a for a in sys.argv[1:] if a in ("pip", "uv")] or ["pip", "uv"]
        for installer in installers:
            rows.append(install(host, installer))
            write(rows, src, python, name="-".join(installers))   # each row as it comes: a later step may fail
        if "--no-patched" in sys.argv:
            return
        best = min(rows, key=lambda r: r["converge_s"])["installer"]
        sh(host, f"rm -rf /opt/rigup/vllm/pip-{VERSION}")   # disk: one venv at a time
        src = sources(host)
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(patched(host, best, src, Path(tmp)))
        write(rows, src, python)
    finally:
        lab.down()


if __name__ == "__main__":
    main()
