"""rigup's roles, one package each; none imports another (shared code is in rigup/).

:data:`ORDER` is the order deploy.py runs them in; :func:`in_order` imports them (only the
plays do: a pure module such as roles/llama_server/command.py imports no other role).
"""

from importlib import import_module
from types import ModuleType

ORDER = ("base", "cuda_toolkit", "llama_cpp", "model_fetch", "gpu_power", "gpu_guard", "cmpunlocker",
         "llama_server", "vllm", "balancer")


def in_order() -> list[ModuleType]:
    """The role packages, in the order they run."""
    return [import_module(f"roles.{name}") for name in ORDER]
