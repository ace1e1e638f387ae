"""roles/balancer: HAProxy (Debian's ``haproxy`` package, started by systemd) in front of
replicated serving instances, and on gateway hosts in front of the fleet.

What it does to a host:
- reads the backends files the serving roles write for their replicated instances
  (rigup.names.balancer_file: roles/llama_server and roles/vllm, one per instance with
  ``replicas`` > 1) and, with ``balancer_gateway`` (the inventory group ``gateway``,
  group_vars/gateway.yml), every other inventory host's instances (their inventory address and port);
- when nothing is left to balance (replicas gone back to one server), stops and disables the
  HAProxy it started, its config emptied of frontends (one not rigup's is left alone);
- when there is anything to balance: installs haproxy and socat, the drain helper
  ``{rigup_prefix}/bin/rigup-balancer-drain`` (the replicas' units drain themselves with it before
  a stop and rejoin once healthy), and /etc/haproxy/haproxy.cfg (roles/balancer/config.py): per
  instance a frontend on its host:port, ``balance leastconn``, health checks on ``/health`` (a
  server out after 2 failed checks, back after 2 good ones), long timeouts for streamed
  completions, retries and redispatch on connection failures only; a stats page and Prometheus
  exporter on 127.0.0.1:balancer_stats_port, the runtime API on a unix socket. A new config is
  checked with ``haproxy -c`` before it replaces the running one, then ``systemctl reload``
  (established connections stay); a bad one never replaces it;
- after a change, each frontend must answer /health 200.
API keys stay the servers' to check: HAProxy passes Authorization through. With
``fleet_api_key`` (one key for the fleet, kept on the controller: rigup.secrets.fleet_api_key) a
gateway also checks it, from a root-only file (config.GATEWAY_KEY), before a request crosses the
rack network; the serving hosts, which get the same key, check it again.

Variables (roles/balancer/defaults.yml): balancer_gateway, balancer_gateway_bind, fleet_api_key,
fleet_api_key_src,
balancer_stats_port, balancer_timeout_s, balancer_check_interval_ms, balancer_health_timeout;
rigup_prefix (roles/base). Refusals: roles/balancer/checks.py.
"""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import host, logger
from pyinfra.api import OperationError, StringCommand, deploy
from rigup.role import Role
from rigup.probe import operation
from pyinfra.operations import apt

from rigup.probe import python
from tenacity import RetryError, retry, retry_if_result, stop_after_delay, wait_fixed

from rigup.gpu.plan import Plan
from rigup.config import Config, config_of, fleet_data, role_defaults
from rigup.gate import endpoint
from rigup.files import program_text
from rigup.names import balancer_drain
from rigup.secrets import fleet_api_key, written
from rigup.state import read_once, reading
from rigup.text import shown, shown_lines
from roles.balancer.checks import CHECKS, ports
from roles.balancer.config import GATEWAY_KEY, STATE_DROPIN, gateway_backends, haproxy_cfg, problems, state_dropin
from roles.balancer.facts import CONFIG, BalancerState

__all__ = ["apply", "CHECKS", "ports"]

DRAIN_SOURCE = program_text("roles/balancer/shipped/drain.py")   # rigup-balancer-drain, compared by its sha


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def wanted_backends(state: dict, gateway: list[dict]) -> list[dict]:
    """The host's backends: its replicated instances' (read on the host), then the gateway's."""
    return [{"name": name, **b} for name, b in sorted(state.get("backends", {}).items())] + gateway


@reading(BalancerState, "drain")
@operation()
def balanced(gateway: list[dict], drain: str, cache_seconds: int, fleet_key: str | None = None):
    """HAProxy installed, configured for the host's backends and running, when it has any (with
    nothing to balance: :func:`idle`). ``fleet_key``: the fleet's API key, which a
    gateway's frontends of keyed instances check (config.GATEWAY_KEY, sent on stdin)."""
    state = read_once(BalancerState, drain=drain)
    backends = wanted_backends(state, gateway)
    if not backends:
        yield from idle(state, haproxy_cfg([], config_of(host)))
        return
    bad = problems(backends)
    if bad:
        raise OperationError("balancer: refused to write haproxy.cfg: " + "; ".join(bad))
    changed = False
    if state.get("missing"):
        yield from apt.update._inner(cache_time=cache_seconds)
        yield from apt.packages._inner(packages=state["missing"], no_recommends=True)
        changed = True
    if state.get("drain") != _sha(DRAIN_SOURCE):
        yield f"install -d -m 755 {shlex.quote(drain.rsplit('/', 1)[0])}"
        yield written(drain, DRAIN_SOURCE, mode="755")
    dropin = state_dropin(drain)   # the servers' state kept across a reload or a restart
    if state.get("dropin") != _sha(dropin):
        yield f"install -d -m 755 {shlex.quote(STATE_DROPIN.rsplit('/', 1)[0])}"
        yield written(STATE_DROPIN, dropin, mode="644")
        yield "systemctl daemon-reload"
    key_line = f"Bearer {fleet_key}\n" if fleet_key and any(b.get("key") for b in backends) else None
    if key_line and state.get("key") != _sha(key_line):
        yield written(GATEWAY_KEY, key_line, mode="600")   # HAProxy reads it as root, before its chroot
        changed = True
    text = haproxy_cfg(backends, config_of(host))
    new = shlex.quote(CONFIG + ".rigup-new")
    if changed or state.get("cfg") != _sha(text):
        yield written(CONFIG + ".rigup-new", text, mode="644")
        # a config HAProxy refuses never replaces the running one (it stays in .rigup-new to read)
        yield StringCommand(f"haproxy -c -q -f {new} && mv {new} {CONFIG} && systemctl enable -q haproxy && "
                            "systemctl reload-or-restart haproxy")
    elif state.get("active") != "active" or state.get("enabled") != "enabled":
        yield "systemctl enable -q haproxy && systemctl start haproxy"
    else:
        host.noop(f"haproxy serves {len(backends)} backend(s) with its current config")


def idle(state: dict, text: str):
    """Nothing to balance: rigup's HAProxy (its config marked) gets the config without frontends
    and is stopped and disabled (the ports go back to the single servers that replace replicas);
    an HAProxy not rigup's is left alone."""
    if not state.get("ours"):
        host.noop("nothing to balance")
        return
    if state.get("cfg") != _sha(text):
        yield written(CONFIG, text, mode="644")
    if state.get("active") == "active" or state.get("enabled") == "enabled":
        yield "systemctl disable --now -q haproxy"
    elif state.get("cfg") == _sha(text):
        host.noop("nothing to balance: rigup's haproxy is stopped and disabled")


def frontends_answer(state, host, gateway: list[dict], drain: str, timeout: int) -> bool:
    """Each frontend answers /health 200 within ``timeout`` s (a ``python.call`` after a change);
    else the host fails with HAProxy's last journal lines."""
    backends = wanted_backends(host.get_fact(BalancerState, drain=drain), gateway)

    def code(url: str) -> str:
        ok, out = host.run_shell_command(StringCommand("curl", "-s", "-m", "5", "-o", "/dev/null", "-w",
                                                       "%{http_code}", url), print_output=False, print_input=False)
        return out.stdout.strip() if ok else ""

    for b in (b for b in backends if not b.get("route")):   # a router model's backend has no frontend
        url = endpoint(b["bind"], b["port"]) + "/health"
        try:
            retry(stop=stop_after_delay(timeout), wait=wait_fixed(1),
                  retry=retry_if_result(lambda c: c != "200"))(code)(url)
        except RetryError:
            _, out = host.run_shell_command("journalctl -u haproxy -n 20 --no-pager -o cat", print_output=False)
            host.log_styled(shown(f"balancer: {url} did not answer 200 within {timeout} s; haproxy's journal:")
                            + "\n" + shown_lines(out.stdout), fg="red", log_func=logger.error)
            return False
        host.noop(f"balancer: {url} answers 200")
    return True


@deploy("balancer", data_defaults=role_defaults("balancer"))
def apply(plan: Plan, data: Config):
    gateway = []
    if data["balancer_gateway"]:
        gateway = gateway_backends(host.name, fleet_data(host),
                                   data["balancer_gateway_bind"], bool(data["fleet_api_key"]))
    drain = balancer_drain(data)
    done = balanced(name="HAProxy in front of replicas" + (" and the fleet (gateway)" if gateway else ""),
                    gateway=gateway, drain=drain, cache_seconds=data["apt_cache_seconds"],
                    fleet_key=fleet_api_key(data) if gateway else None)
    python.call(frontends_answer, gateway=gateway, drain=drain, timeout=data["balancer_health_timeout"],
                name="balancer frontends answer", _if=done.did_change)


ROLE = Role("balancer", apply, checks=CHECKS, ports=ports)
