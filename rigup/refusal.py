"""The refusal: why a host cannot go on, as preflight prints it; and what checks are.

Each role declares its refusals in ``roles/<role>/checks.py``: pure functions
``check(plan, facts, data) -> list[Refusal]`` (plan: rigup.gpu.plan.hardware_plan; facts: the
value of rigup.gpu.facts.HardwareFacts with ``model_bytes``; data: the host's merged data),
gathered in its ``CHECKS``. A serving role also says which ports its instances take
(``ports(plan, data, fleet) -> list[Port]``). The plays hand every role's checks to preflight, which
imports no role.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional, TYPE_CHECKING

from rigup.names import bind_scope
from rigup.units import replica_port

if TYPE_CHECKING:
    from rigup.models import ServingInstance

FIX_CONFIG = ("correct it where it is set (group_vars, inventory host data or --data); "
              "roles/*/defaults.yml and roles/*/schema.py document each key")


@dataclass(frozen=True)
class Refusal:
    """Why a host cannot go on: what is wrong, why it matters, and how to fix it."""

    what: str
    why: str
    fix: str
    check: str = ""

    def line(self, host_name: str) -> str:
        return f"[{host_name}] refused: {self.what}: {self.why}; fix: {self.fix}"


class Port(NamedTuple):
    """A port a role's unit will listen on: ``where`` names the setting (``llama_server_instances.glm``),
    ``owners`` the process names that are that unit itself (a listener of theirs is no conflict) when
    root's or of ``users``, the accounts the unit runs as (none given: the rigup user's)."""

    port: int
    where: str
    owners: tuple[str, ...] = ()
    users: tuple[str, ...] = ()


class Fleet(NamedTuple):
    """The hosts of the run, for what one host's settings mean to another (a peer to share with):
    ``me`` is the host being checked, ``hosts`` every host's data by name, ``plan_of`` another
    host's hardware plan by name (read by preflight from that host's facts: an RPC group's VRAM),
    None when it cannot be read."""

    me: str
    hosts: dict
    plan_of: Optional[Callable[[str], "dict | None"]] = None


Check = Callable[[dict, dict, dict], "list[Refusal]"]


def config_refusals(problems: list[tuple[str, str]]) -> list[Refusal]:
    """(key path, why) problems of a nested map as refusals."""
    return [Refusal(path, why, FIX_CONFIG, "config") for path, why in problems]


def needs_systemd(facts: dict, needs: list[str]) -> list[Refusal]:
    """A refusal when ``needs`` (settings that run as systemd units) is not empty on a host where
    systemd is not PID 1 (a docker-style rental container)."""
    if facts.get("systemd", True) or not needs:
        return []
    return [Refusal(f"{', '.join(needs)} on a host without systemd",
                    "they run as systemd units (serving, the boot unit that keeps power limits, the unlock) "
                    "and systemd is not PID 1 here (a container?)",
                    "use a host booted with systemd, or unset them for this host (model downloads and the "
                    "llama.cpp build work without systemd)", "systemd")]


def open_listener(where: str, bind: str, lacking: str, fix: str, check: str, because: str = "") -> Refusal:
    """The refusal of a listener (``where``: the key that binds it) on ``bind``, beyond loopback
    (rigup.names.bind_scope), with neither a key nor an allow-list (``lacking`` says which it
    lacks, ``because`` why): every unauthenticated listener of rigup gets one or the other."""
    return Refusal(f"{where} listens on {bind} {lacking}", "an address beyond loopback serves anyone who can reach it"
                   + (" (a wildcard: every interface)" if bind_scope(bind) == "wildcard" else "") + because, fix, check)


def serving_exposure(var: str, instances: dict) -> list[Refusal]:
    """Refusals for serving instances (``var``: llama_server_instances, vllm_instances) bound
    beyond loopback (rigup.names.bind_scope) without an API key: the servers check no key by
    default, and anyone on the network could use the GPUs. (``--host`` and a key in extra_args are
    refused with the instance's other keys: rigup owns those flags.)"""
    return [open_listener(f"{var}.{name}", inst["host"], "without an API key",
                          f"set {var}.{name}.api_key: true, or host: 127.0.0.1", "open_without_key")
            for name, inst in instances.items() if not inst["api_key"] and bind_scope(inst["host"]) != "loopback"]


def serving_ports(where: str, server: str, inst: ServingInstance, servers: int) -> list[Refusal]:
    """Refusals for a serving instance whose servers (``servers``: one on its port, or N replicas
    on port + 1 + K behind the balancer) would listen outside 1024..65535: they run as the
    unprivileged rigup user, who cannot bind a port below 1024."""
    ports = [inst["port"]] if servers <= 1 else [replica_port(inst, k) for k in range(servers)]
    span = f"port {ports[0]}" if len(ports) == 1 else f"ports {ports[0]}..{ports[-1]} of its {servers} replicas"
    if ports[-1] > 65535:
        return [Refusal(f"{where}.replicas: {servers} replicas from port {inst['port']}",
                        f"replica K listens on port + 1 + K: {span}, past 65535",
                        f"lower {where}.port or {where}.replicas", "ports")]
    if ports[0] < 1024:
        return [Refusal(f"{where}.port: {span} below 1024", f"{server} runs as the unprivileged rigup user, "
                        "who cannot bind a privileged port", f"set {where}.port to 1024 or above", "ports")]
    return []


def gpus_text(indexes: list) -> str:
    """[0, 1, 2, 3, 5] -> "GPU 0-3, 5"."""
    nums = sorted(i for i in indexes if isinstance(i, int))
    runs: list[list[int]] = []
    for i in nums:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
    return f"GPU {text}" if text else "GPUs"


def watts_text(value: float | None) -> str:
    return "?" if value is None else f"{float(value):g}"
