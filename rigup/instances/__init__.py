"""The serving engines' instances as every reader reads them: each engine's entry form made from
its contract's rows (rigup/contract/), the rules its values follow, and ``instances(data)``, the
host's entries normalised (every key, its default filled in), tuned and checked, with problems by
key path. The engines' roles (roles/llama_server, roles/vllm), rigup/serving.py's plan and the
readers beyond them (the metrics, the watchdog, rigup/rpc.py: llama-server's ``normalised``; the
balancer, plays/bench.py and status.py: both engines', :func:`every`) read the one shape from
here, so no reader imports a role.

- ``llama_server``: ``llama_server_instances`` (:class:`~rigup.instances.llama_server.LlamaInstance`)
- ``tuned``: ``llama_server_tuned``, the flags tune.py measured, laid over the instances
- ``vllm``: ``vllm_instances`` (:class:`~rigup.instances.vllm.VllmInstance`)

Not shipped to hosts, so not bound to the standard library.
"""

from __future__ import annotations

from rigup.instances import llama_server, vllm


ENGINES = (("llama_server_instances", llama_server), ("vllm_instances", vllm))   # each serving map's


def every(data) -> list[tuple[str, str, dict]]:
    """(its map, its name, the instance) of each of the host's serving instances (``data``: its
    configuration, or a peer's), each engine's ``normalised``: llama-server's, then vLLM's, each by
    name. An entry not of its form is left out (:func:`left_out`; preflight refuses it before a
    converge reads it)."""
    return [(var, name, inst) for var, engine in ENGINES for name, inst in engine.normalised(data).items()]


def left_out(data) -> list[tuple[str, str]]:
    """(key path, problem) of each serving entry :func:`every` leaves out: not of its form."""
    return [p for _, engine in ENGINES for p in engine.formed(data)[1]]
