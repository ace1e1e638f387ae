"""A stand-in for vLLM, for the vllm role's lab tests: a tiny python package named ``vllm`` in a
real git repository, whose ``vllm`` console script serves /health, /v1/models and
/v1/chat/completions with python's http.server. It tests rigup's install (pin, patch series,
stamp), environment file, unit, health gate and restart logic end to end without the engine
(the lab has no GPU, and a CPU build of vLLM is too heavy for CI).

The package builds with an in-tree PEP 517 backend (no setuptools or wheel needed, offline).
For the CMP runbook's recipes (tests/roles/test_cmpunlocker.py): :func:`make_fork` (a fork at a
commit, on a branch), :func:`extra_wheel` (an extra package for vllm_extra_packages) and
:func:`published` (the bare repository and the wheels on lab hosts).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

VERSION = "0.0.1"

BACKEND = r'''
"""In-tree PEP 517 backend: a wheel of vllm/ with a `vllm` console script."""
import base64, hashlib, os, zipfile

NAME, VERSION = "vllm", "0.0.1"
DIST = f"{NAME}-{VERSION}.dist-info"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(os.path.abspath(__file__))
    files = {}
    for name in sorted(os.listdir(os.path.join(here, NAME))):
        if name.endswith(".py"):
            with open(os.path.join(here, NAME, name), "rb") as f:
                files[f"{NAME}/{name}"] = f.read()
    files[f"{DIST}/METADATA"] = f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode()
    files[f"{DIST}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: rigup-stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{DIST}/entry_points.txt"] = b"[console_scripts]\nvllm = vllm.cli:main\n"
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{DIST}/RECORD,,")
    files[f"{DIST}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel
'''

PYPROJECT = """[build-system]
requires = []
build-backend = "stub_backend"
backend-path = ["."]

[project]
name = "vllm"
version = "0.0.1"
"""

INIT = '''"""A stand-in for vLLM (rigup's lab tests)."""
__version__ = "0.0.1"
GREETING = "hello from the stub"
PATCH_LEVEL = 0
'''

CLI = r'''"""`vllm serve MODEL --host H --port P ...`: sleeps a little (vLLM refuses connections while it
loads), then answers /health, /v1/models, /v1/chat/completions and /rigup-stub (its argv and env)."""
import argparse, json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import vllm


def main():
    if sys.argv[1:] == ["--version"]:
        print(vllm.__version__)
        return 0
    p = argparse.ArgumentParser(prog="vllm")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("model")
    s.add_argument("--host", default="")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--tensor-parallel-size", type=int, default=1)
    s.add_argument("--pipeline-parallel-size", type=int, default=1)
    s.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    s.add_argument("--served-model-name", nargs="+")
    args, extra = p.parse_known_args()
    if not os.path.isdir(args.model):
        print(f"vllm-stub: no model directory {args.model}", file=sys.stderr)
        return 1
    partition = os.environ.get("VLLM_PP_LAYER_PARTITION")
    if partition and len(partition.split(",")) != args.pipeline_parallel_size:
        print(f"ValueError: VLLM_PP_LAYER_PARTITION {partition} for pp {args.pipeline_parallel_size}", file=sys.stderr)
        return 1
    with open(os.path.join(os.environ["HOME"], "stub-was-here"), "w") as f:  # HOME is writable
        f.write(str(os.getpid()))
    served = (args.served_model_name or [args.model])[0]
    print(f"vllm-stub {vllm.__version__} loading {args.model} (patch level {vllm.PATCH_LEVEL})", flush=True)
    time.sleep(float(os.environ.get("VLLM_STUB_LOAD_SECONDS", "2")))
    info = {"argv": sys.argv, "extra": extra, "served": served, "patch_level": vllm.PATCH_LEVEL,
            "env": {k: ("(set)" if k == "VLLM_API_KEY" else v) for k, v in os.environ.items()
                    if k.startswith(("VLLM_", "NCCL_", "GLOO_", "CUDA_", "HF_", "XDG_", "RAY_")) or k == "HOME"}}
    key = os.environ.get("VLLM_API_KEY")  # as vLLM: /v1 needs it, /health does not

    class Handler(BaseHTTPRequestHandler):
        def reply(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def denied(self):
            if key and self.headers.get("Authorization") != f"Bearer {key}":
                self.reply(401, {"error": "Unauthorized"})
                return True
            return False

        def do_GET(self):
            if self.path.startswith("/v1/") and self.denied():
                return
            if self.path == "/health":
                self.reply(200, {})
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": served, "owned_by": "vllm", "root": args.model}]})
            elif self.path == "/rigup-stub":
                self.reply(200, info)
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            doc = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path != "/v1/chat/completions":
                return self.reply(404, {"error": "not found"})
            if self.denied():
                return
            if doc.get("model") != served:
                return self.reply(404, {"error": {"message": f"The model `{doc.get('model')}` does not exist."}})
            self.reply(200, {"object": "chat.completion", "model": served,
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": vllm.GREETING}}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGINT, lambda *a: (print("vllm-stub: SIGINT, shutting down", flush=True), os._exit(0)))
    print(f"vllm-stub serving {served} on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
'''


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "rigup", "GIT_AUTHOR_EMAIL": "lab@rigup", "GIT_COMMITTER_NAME": "rigup",
           "GIT_COMMITTER_EMAIL": "lab@rigup", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
           "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_repo(path: Path) -> str:
    """The stub package as a git repository at ``path`` (one commit); returns the commit id."""
    (path / "vllm").mkdir(parents=True)
    (path / "stub_backend.py").write_text(BACKEND)
    (path / "pyproject.toml").write_text(PYPROJECT)
    (path / "vllm" / "__init__.py").write_text(INIT)
    (path / "vllm" / "cli.py").write_text(CLI)
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "vllm stub")
    return git(path, "rev-parse", "HEAD")


def _diff(repo: Path, edit) -> str:
    init = repo / "vllm" / "__init__.py"
    before = init.read_text()
    init.write_text(edit(before))
    diff = git(repo, "diff") + "\n"
    git(repo, "commit", "-q", "-am", "patch")
    return diff


def make_patches(repo: Path, out: Path) -> dict[str, Path]:
    """A series made against the repo's commit (0001 then 0002, which needs 0001), and 0003 that
    does not apply (its context is not in the tree). The repo is left at its first commit."""
    out.mkdir(parents=True, exist_ok=True)
    base = git(repo, "rev-parse", "HEAD")
    texts = {
        "0001-greeting.patch": _diff(repo, lambda t: t.replace('"hello from the stub"',
                                                               '"hello from the patched stub"')),
        "0002-patch-level.patch": _diff(repo, lambda t: t.replace(  # its context needs 0001
            'patched stub"\nPATCH_LEVEL = 0', 'patched stub"\nPATCH_LEVEL = 2')),
    }
    git(repo, "reset", "-q", "--hard", base)
    texts["0003-does-not-apply.patch"] = texts["0002-patch-level.patch"].replace("PATCH_LEVEL = 0", "PATCH_LEVEL = 7") \
        .replace("PATCH_LEVEL = 2", "PATCH_LEVEL = 3")
    paths = {}
    for name, text in texts.items():
        (out / name).write_text(text)
        paths[name] = out / name
    return paths


def manifest(paths, out: Path, wrong: str | None = None) -> Path:
    """A sha256sum manifest of ``paths``; with ``wrong``, that file's line carries a wrong hash."""
    lines = []
    for p in paths:
        digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
        if Path(p).name == wrong:
            digest = hashlib.sha256(b"something else").hexdigest()
        lines.append(f"{digest}  {Path(p).name}")
    out.write_text("\n".join(lines) + "\n")
    return out


def make_fork(repo: Path) -> str:
    """A fork of the stub at a commit, already patched: branch ``cmp170hx`` of ``repo`` with one
    commit over its first (the greeting and patch level of a fork), as operators' sm_80 forks
    are; the repo is left on main. Returns the fork's commit id."""
    base = git(repo, "rev-parse", "main")
    git(repo, "checkout", "-q", "-b", "cmp170hx", base)
    init = repo / "vllm" / "__init__.py"
    init.write_text(INIT.replace('"hello from the stub"', '"hello from the fork"').replace("PATCH_LEVEL = 0",
                                                                                            "PATCH_LEVEL = 5"))
    git(repo, "commit", "-q", "-am", "sm80 fork")
    commit = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    return commit


EXTRA_NAME, EXTRA_VERSION = "rigup-stub-extra", "0.0.1"


def extra_wheel(out: Path) -> Path:
    """A wheel of a tiny package ``rigup-stub-extra`` 0.0.1 (module ``rigup_stub_extra``) in
    ``out``: what vllm_extra_packages installs in the lab, offline (pip --find-links)."""
    import base64
    import zipfile

    dist = f"rigup_stub_extra-{EXTRA_VERSION}.dist-info"
    files = {"rigup_stub_extra/__init__.py": f'VERSION = "{EXTRA_VERSION}"\n'.encode(),
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {EXTRA_NAME}\nVersion: {EXTRA_VERSION}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rigup-stub\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
              for p, d in files.items()] + [f"{dist}/RECORD,,"]
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"rigup_stub_extra-{EXTRA_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def published(lab, tmp: Path, *hosts: str) -> None:
    """``tmp``'s vllm-stub.git (a bare clone of the stub repository) and its wheels/ on lab
    ``hosts`` at /root/vllm-stub (vllm_git_url file:///root/vllm-stub/vllm-stub.git)."""
    names = [n for n in ("vllm-stub.git", "wheels") if (tmp / n).exists()]
    tar = subprocess.run(["tar", "c", "-C", str(tmp), *names], check=True, capture_output=True).stdout
    for name in hosts:
        subprocess.run(lab.ssh_argv(name) + ["--", "rm -rf /root/vllm-stub && mkdir -p /root/vllm-stub && "
                                             "tar x -C /root/vllm-stub && chmod -R a+rX /root/vllm-stub"],
                       input=tar, check=True)
