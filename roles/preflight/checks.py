"""Preflight's own refusals (the other roles declare theirs in ``roles/<role>/checks.py``).

    check_gpu_host  GPU roles on a host without a usable NVIDIA GPU (gpu_enabled is preflight's)
    port_refusals   a port two roles' units would share, or one a process not theirs holds
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.refusal import Port, Refusal

if TYPE_CHECKING:
    from rigup.gpu.plan import Plan
    from rigup.gpu.facts import Facts
    from rigup.config import Config


def check_gpu_host(plan: Plan, facts: Facts, data: Config) -> list[Refusal]:
    """GPU roles enabled on a host where no NVIDIA GPU answers (no nvidia-smi, no driver)."""
    if data.get("gpu_enabled", True) and plan.get("cpu_only"):
        return [Refusal("GPU roles enabled on a host without a usable NVIDIA GPU", plan["why_cpu_only"],
                        "install the NVIDIA driver, or set gpu_enabled: false for this host", "gpu_host")]
    return []


def port_refusals(claims: list[Port], facts: Facts, user: str | None = None) -> list[Refusal]:
    """A port given to several units, or already held by a process that is not the unit's own: each
    of its listeners must be named as the unit (``owners``) and be root's or the account the unit runs
    as (``users``, else the rigup ``user``), for its role restarts it (re5 N1: a system account's passed
    by its name; N4: only the port's first socket was looked at)."""
    listening = facts.get("listening_ports", {})
    if listening is None:   # neither ss nor /proc/net/tcp answered: refuse rather than guess
        return [Refusal(f"cannot tell whether port {claim.port} is free ({claim.where})",
                        "neither ss nor /proc/net/tcp could be read on this host",
                        "install iproute2 (ss), or check the port by hand and free it", "ports")
                for claim in claims]
    found = []
    by_port: dict[int, list[str]] = {}
    for claim in claims:
        by_port.setdefault(claim.port, []).append(claim.where)
    used = set(listening) | set(by_port)
    for port, wheres in by_port.items():
        if len(wheres) > 1:
            found.append(Refusal(f"port {port} is given to {len(wheres)} instances",
                                 f"{' and '.join(wheres)} would all listen on it",
                                 "give each instance its own port", "ports"))
    for claim in claims:
        users = claim.users or ((user,) if user else ())
        own = {*claim.owners, *(f"{name} (user {u})" for name in claim.owners for u in users)}
        names = listening.get(claim.port)   # several processes' names joined (rigup/gpu/facts.py _listeners)
        if claim.port not in listening or (names is not None and set(names.split(" and ")) <= own):
            continue
        process = listening[claim.port]
        free = next((p for p in range(claim.port + 1, 65536) if p not in used), None)
        who = f"process {process}" if process else "a process that cannot be named here (no ss, or not root)"
        stop = f"stop {process} " if process else "stop it "
        found.append(Refusal(
            f"port {claim.port} of {claim.where} is already taken",
            f"{who} listens on it (ss -ltnp 'sport = :{claim.port}'), so the server could not bind",
            f"{stop}or give the instance another port" + (f" ({claim.where}.port: {free} is free)" if free else ""),
            "ports"))
    return found
