"""Issue 63 on a GPU (not part of the repository): tune.py's sweep of each model of a router, alone,
from the command lines plays/tuning.py model_argv made on the controller (.gpu/router-tune.json);
then (serve) the router as the next converge writes it with the tuned flags (.gpu/router-tuned.json)."""
import json, os, shutil, signal, subprocess, sys, time, urllib.request
from pathlib import Path

OUT, W = Path(os.environ["OUT"]), Path("/root/rigup-gpu")
W.mkdir(parents=True, exist_ok=True)
step = sys.argv[1]
if not (W / "build.json").exists():
    subprocess.run([sys.executable, "tests/gpu/check.py", "build", "--archive", ".gpu/llama.cpp.tar.gz", "--work", str(W)],
                   check=True)
build = json.loads((W / "build.json").read_text())
bindir = W / "llama.cpp" / "builds" / build["id"] / "bin"
for m in "ab":
    shutil.copy("roles/llama_cpp/smoke.gguf", W / f"{m}.gguf")


def sub(argv):
    return [a.replace("/BIN", str(bindir)).replace("/W/", f"{W}/") for a in argv]


def get(port, path, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode() if body else None,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.loads(r.read())


if step == "sweep":
    doc = json.load(open(".gpu/router-tune.json"))
    for m, spec in doc["specs"].items():
        (OUT / m).mkdir(parents=True, exist_ok=True)
        spec = dict(spec, argv=sub(spec["argv"]), logs=str(OUT / m))
        path = OUT / f"x-{m}.spec.json"
        path.write_text(json.dumps(spec, indent=1))
        started = time.monotonic()
        r = subprocess.run([sys.executable, "plays/shipped/tune.py", str(path), str(OUT / f"x-{m}.json")],
                           env={**os.environ, "PYTHONPATH": "."}, timeout=260)
        print(f"model {m}: rc {r.returncode} in {time.monotonic() - started:.0f} s", flush=True)
else:
    doc = json.load(open(".gpu/router-tuned.json"))
    preset = W / "x.models.ini"
    preset.write_text(doc["preset"].replace("/W/", f"{W}/"))
    argv = sub(doc["router_argv"])
    argv[argv.index("--models-preset") + 1] = str(preset)
    port = int(argv[argv.index("--port") + 1])
    print(" ".join(argv), flush=True)
    proc = subprocess.Popen(argv, stdout=open(OUT / "router.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    out = {"argv": argv, "preset": preset.read_text(), "models": {}}
    try:
        for _ in range(240):
            try:
                if get(port, "/health")[0] == 200:
                    break
            except OSError:
                time.sleep(0.5)
        for m in "ab":
            status, answer = get(port, "/v1/chat/completions", {"model": m, "max_tokens": 8, "messages": [
                {"role": "user", "content": "hello"}]})
            children = [l for l in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
                        if "llama-server" in l and "--models-preset" not in l]
            out["models"][m] = {"status": status, "tokens": answer.get("usage"), "children": children}
        out["listed"] = get(port, "/models")[1]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    (OUT / "serve.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out["models"], indent=1))
