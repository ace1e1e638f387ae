"""Hosts for the unit tests of the roles' refusals: (plan, facts) from the fact fixtures, a
host's merged data, and every role's refusals as the play hands them to preflight."""

from pathlib import Path

from rigup.config import Config, declared
from rigup.gpu.facts import parse_gpus
from rigup.gpu.plan import hardware_plan
from roles import in_order, preflight

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
GIB = 1024 ** 3
REV = "0123456789abcdef0123456789abcdef01234567"
# What an enabled cmpunlocker and a vLLM instance need pinned (their roles refuse them unpinned).
PINS = {"cmpunlocker_source": "https://example.invalid/cmpunlocker.git", "cmpunlocker_version": REV,
        "vllm_pip_version": "0.33.0"}
NO_DRIVER = {"version": None, "kernel_module": None, "loaded": False}


def host(profile: str, driver: str | None = None, **extra) -> tuple[dict, dict]:
    """(plan, facts) of a host from the fact fixtures: a100 (8 cards), h100 (4), cmp170hx (6 locked)."""
    csv = {"a100": "a100-query-nounits.csv", "h100": "h100-query-nounits.csv",
           "cmp170hx": "cmp170hx-locked-query-nounits.csv"}[profile]
    gpus = parse_gpus((FIX / csv).read_text().splitlines())
    drv = {"version": driver or gpus[0]["driver_version"], "kernel_module": "open", "loaded": True}
    facts = {"gpus": gpus, "driver": drv, "cuda_toolkits": [], "listening_ports": {22: "sshd"},
             "secure_boot": None, "kernel": {"release": "6.1.0-28-amd64", "headers": True},
             "systemd": True, "free_disk": {"/": 500 * GIB, "/srv/models/glm": 500 * GIB},
             "model_bytes": {}}
    facts.update(extra)
    return hardware_plan(gpus, drv, []), facts


def data(**overrides) -> dict:
    """A host's merged data: every role default, then ``overrides``."""
    merged = {name: var.default for name, var in declared().items()}
    merged.update({k: v for k, v in PINS.items() if not (k == "vllm_pip_version" and "vllm_git_url" in overrides)})
    merged.update(overrides)
    return merged


GLM = {"repo": "unsloth/GLM-5.3-Flash-GGUF", "revision": REV, "include": ["UD-Q4_K_XL/*"], "size_gib": 186.0}


def glm_llama(**inst) -> dict:
    return {"models": {"glm": dict(GLM)},
            "llama_server_instances": {"glm": {"model": "glm", "port": 8081, **inst}}}


def refusals(plan: dict, facts: dict, data: dict, fleet=None) -> list:
    """Every refusal of every role for this host (what deploy.py's preflight runs)."""
    return preflight.refusals(in_order(), plan, facts, data, fleet)


def answered(d: dict, answers: dict | None = None, resolve=None) -> Config:
    """``d`` as a host's configuration (rigup.config.Config) whose hub said ``answers``
    ({rigup.models.hub_key: facts}), or that asks the hub with ``resolve`` (a role's, first read)."""
    return Config("h", d, (resolve,) if resolve else ((lambda cfg: dict(answers or {})),))


def only(found, check: str):
    """The refusals of one check; fails when another check refused too."""
    assert [r.check for r in found] == [check] * len(found), [r.line("h") for r in found]
    assert found, "nothing was refused"
    return found
