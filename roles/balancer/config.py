"""HAProxy's configuration for a host, as pure functions (no pyinfra): the backends of its
replicated instances (the files roles/llama_server writes, rigup.names.balancer_file) and, on a
gateway, one backend per instance name over every other host's endpoint; and haproxy.service's
drop-in that keeps the servers' state (drain, maint, health) across a reload or a restart."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rigup.boundary.formats import haproxy_address, haproxy_word
from rigup.config import ADDRESS, NAME, ConfigError, peer_value
from rigup.contract import llama_server
from rigup.instances import every, left_out
from rigup.templates import render

if TYPE_CHECKING:
    from rigup.config import Config

GATEWAY_KEY = "/etc/haproxy/rigup-fleet-key.lst"   # "Bearer <the fleet's key>", root-only
# The servers' state across reloads and restarts (the drain helper's STATE): in Debian's /run/haproxy
# (its tmpfiles.d makes it at boot, the admin socket's directory), so a boot starts from the config.
SERVER_STATE = "/run/haproxy/server-state"
STATE_DROPIN = "/etc/systemd/system/haproxy.service.d/rigup-server-state.conf"
RETRY_AFTER_S = 5   # what a queued router's 429 (and a queued request's 503) tells a client to wait
# A router's request is routed by its body's "model" as the router reads it, or not at all (issue 61,
# round 6 FM15): HAProxy's json_query reads a key's first value and its top level only, llama-server's
# JSON (nlohmann) its last, and a key's letters may be \u escapes that json_query does not read as
# "model". So a body naming a "model" key (any such spelling, at any depth: metadata.model too, round 8)
# twice with values json_query or a reader reads (text, a number, true or false: re4 N30), in either
# order, is refused (400), and so is one read whole that names a model in text where json_query read
# none at the top level (its "model" null, a list or a map, absent, a byte order mark before the body,
# which the router skips: N30, N31), and one read whole that is not a JSON object (OBJECT: its shape;
# what is inside is the router's to parse); one HAProxy did not buffer whole (past tune.bufsize) goes
# unrouted, to the default backend, as one naming no model. Each 400 says why, in a line of text.
# PCRE (HAProxy) and Python's re read them alike; HAProxy takes them in single quotes, as they are.
MODEL_NAMED = r'"(m|\\u006[dD])(o|\\u006[fF])(d|\\u0064)(e|\\u0065)(l|\\u006[cC])"[ \t\r\n]*:[ \t\r\n]*'
MODEL_KEY = MODEL_NAMED + '"'
MODEL_TWICE = MODEL_NAMED + r'[-"0-9tf][\s\S]*' + MODEL_NAMED + '[-"0-9tf]'
OBJECT = r'^[ \t\r\n]*\{[\s\S]*\}[ \t\r\n]*$'
# llama-server's paths beyond inference (tools/server/server.cpp of the lab's b8779 tree), each answered
# 403 by every frontend unless one of its features (rigup/contract/llama_server.py HELD_OFF) is allowed
# there: (features, why, HAProxy's condition). Matched on the path as the server decodes it and under
# any --api-prefix, so that neither %73lots nor /x/slots passes.
HELD_PATHS = (
    (("slots",), "/slots: every slot's prompt and output, KV cache files on the host",
     "{ path,url_dec -m reg /slots(/|$) }"),
    (("props",), "POST /props: one client sets the server's globals for all",
     "!METH_GET { path,url_dec -m reg /props/?$ }"),
    (("lora",), "POST /lora-adapters: one client sets the LoRA adapters' scales for all",
     "!METH_GET { path,url_dec -m reg /lora-adapters/?$ }"),
    (("tools", "mcp", "agent"), "/tools: tools run on the host, a shell among them",
     "{ path,url_dec -m reg /tools(/|$) }"),
    (("mcp", "agent"), "/cors-proxy: fetches any URL a client names",
     "{ path,url_dec -m reg /cors-proxy(/|$) }"),
)


def gateway_backends(me: str, hosts: dict[str, dict], bind: str, fleet_key: bool = False) -> list[dict]:
    """A gateway's backends: per instance name served by the inventory's hosts that are not
    gateways (``hosts``: name -> data; their instances as rigup.instances ``every`` reads them), one server per host at its inventory address
    (``ssh_hostname``, else its name) and that host's port of the instance; the frontend binds
    ``bind`` on the port the most hosts use (the lowest of a tie). A server whose host has
    ``rigup_maintenance`` is marked so (4th item): HAProxy keeps it out of the pool (``disabled``).
    ``key``: the frontend checks the fleet's key (``fleet_key``, and a host's instance of that name
    has api_key). ``allow``: the features beyond inference that every host of the backend allows
    (llama_server_allow): only those paths pass (:data:`HELD_PATHS`). A router's model that a host
    pins (rigup/contract/llama_server.py ``pinned``) is sent to that model's own server there, at
    its port: requests name it as before."""
    found: dict[str, list] = {}
    keyed: set[str] = set()
    sets: dict[str, dict[str, list[str]]] = {}   # a router's models (llama-server's also): model -> its hosts
    pins: dict[tuple[str, str, str], int] = {}   # (instance, host, model) -> the port of a pinned model's server
    for host_name, data in sorted(hosts.items()):
        # a peer's settings typed (ConfigError naming it): a run limited to the gateway configures no peer
        if host_name == me or peer_value(data, "balancer_gateway"):
            continue
        address = data.get("ssh_hostname") or host_name
        maintenance = peer_value(data, "rigup_maintenance")
        for key, why in left_out(data)[:1]:   # an instance every() leaves out (a port "8081"): not dropped unsaid
            raise ConfigError(f"host {host_name}: {key}: {why}: fix it in that host's host_vars or group_vars")
        for var, name, inst in every(data):
            found.setdefault(name, []).append([host_name, address, inst["port"], maintenance])
            if fleet_key and inst["api_key"]:
                keyed.add(name)
            if var == "llama_server_instances" and inst["also"]:
                for model in [inst["model"], *inst["also"]]:
                    sets.setdefault(name, {}).setdefault(model, []).append(host_name)
                for model, port in llama_server.pinned(inst).items():   # a pinned model: its own server
                    pins[(name, host_name, model)] = port
    out = []
    for name, servers in sorted(found.items()):
        ports = [s[2] for s in servers]
        port = min(set(ports), key=lambda p: (-ports.count(p), p))
        allow = set.intersection(*(set(peer_value(hosts[s[0]], "llama_server_allow") or ()) for s in servers))
        out.append({"name": f"gateway-{name}", "bind": bind, "port": port, "servers": servers,
                    "key": name in keyed, "allow": sorted(allow)})
        # a model pinned by a host is loaded there always: its home, and not one the router's models share
        pinned = {m for n, _, m in pins if n == name}
        routed = homes({m: h for m, h in sets.get(name, {}).items() if m not in pinned})
        for model, held in sets.get(name, {}).items():
            home = routed.get(model) or {h for h in held if (name, h, model) in pins}
            out.append({"name": f"gateway-{name}.{model}", "bind": bind, "port": port, "key": name in keyed,
                        "route": {"of": f"gateway-{name}", "model": model},
                        "servers": [[s[0], s[1], pins.get((name, s[0], model), s[2]), s[3], s[0] not in home]
                                    for s in servers]})
    return out


def homes(models: dict[str, list[str]]) -> dict[str, set[str]]:
    """Where a gateway sends each model of a router (model -> the hosts that have it, in the set's
    order): its home hosts, the others being its backups. Each model gets its own hosts where there
    are as many hosts as models (hosts 0, k, 2k... of k models for the first), so that each stays
    loaded where it is asked for instead of being swapped in and out everywhere; with fewer hosts
    than models, they share them in turn."""
    out = {}
    for i, (model, hosts) in enumerate(models.items()):
        ordered = sorted(hosts)
        k = len(models)
        own = {h for j, h in enumerate(ordered) if j % k == i % k} if len(ordered) >= k else {ordered[i % len(ordered)]}
        out[model] = own
    return out


def problems(backends: list[dict]) -> list[str]:
    """Why a backend cannot go into haproxy.cfg as it is (a name, address or port that is not one, a
    backends file not of its form: its ``refused``): the config is written from validated data, and
    checked again here before it reaches a file. A backend's name, and a server's name in its backend,
    given twice is refused here, naming them, not by HAProxy's check of the whole config (round 10 G1:
    one host's llama_server_instances.g and vllm_instances.g, or a router r's model b beside another
    host's instance r.b, failed every backend's config)."""
    found = []
    seen = [b.get("name") for b in backends if "refused" not in b]
    for name in sorted({n for n in seen if seen.count(n) > 1}, key=str):
        found.append(f"{name!r}: two backends of that name (an instance's and a router's model: its "
                     f"NAME.MODEL, or one instance name in both llama_server_instances and vllm_instances): "
                     "rename one")
    for b in backends:
        if "refused" in b:   # a backends file not of its form (facts.backends_record), named
            found.append(str(b["refused"]))
            continue
        hosts = [s[0] for s in b["servers"]]
        for host in sorted({h for h in hosts if hosts.count(h) > 1}, key=str):
            found.append(f"{b['name']!r}: host {host!r} serves it twice (one instance name in both its "
                         "llama_server_instances and vllm_instances): rename one")
        names = [b["name"]] + [s[0] for s in b["servers"]]
        addresses = [b["bind"]] + [s[1] for s in b["servers"]]
        ports = [b["port"]] + [s[2] for s in b["servers"]]
        if not all(isinstance(n, str) and NAME.fullmatch(n) for n in names):
            found.append(f"{b['name']!r}: a name is not a name: {names}")
        if not all(isinstance(a, str) and ADDRESS.fullmatch(a) for a in addresses):
            found.append(f"{b['name']!r}: an address is not one: {addresses}")
        if not all(isinstance(p, int) and 0 < p < 65536 for p in ports):
            found.append(f"{b['name']!r}: a port is not one: {ports}")
        limits = [b[k] for k in ("slots", "queue", "wait_s") if k in b]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v < 1 << 20 for v in limits):
            found.append(f"{b['name']!r}: a queue limit is not a count: {limits}")
    return found


def held(allow) -> dict:
    """A frontend's 403s for ``allow`` (the features beyond inference allowed there): ``models``,
    whether a router's model management is held off (models_admin), and ``paths``: (why,
    condition) of each of :data:`HELD_PATHS` that none of its features opens."""
    allow = set(allow or ())
    return {"models": "models_admin" not in allow,
            "paths": [(why, cond) for features, why, cond in HELD_PATHS if not allow & set(features)]}


def haproxy_cfg(backends: list[dict], data: Config) -> str:
    """/etc/haproxy/haproxy.cfg: a loopback stats and Prometheus frontend, the admin socket, and
    per backend a frontend on its bind:port (on a gateway, refusing a request without the fleet's
    key, /health aside, when the backend's ``key``), ``leastconn`` over its servers, health checks on
    /health, retries and redispatch on connection failures only (a generation is never replayed);
    the servers' state read at start from SERVER_STATE (:func:`state_dropin`). A queued router's
    backend (``slots``, ``queue``, ``wait_s``): at most ``slots`` requests at its server, ``queue``
    more waiting at most ``wait_s`` s, beyond them 429 with Retry-After (a queued request that
    waited too long: 503 with it). A gateway's router instance (``route`` backends, one per model of
    its set: :func:`homes`): the frontend reads the request's ``model`` and sends it to that model's
    backend, its home hosts first, the others as backups. Every frontend answers 403 for llama-server's
    paths beyond inference (:func:`held`) that its backend's ``allow`` (a gateway's: every host's
    behind it) or, on the host's own, its llama_server_allow does not open."""
    def word(value, what: str) -> str:
        return haproxy_word(value, f"haproxy.cfg: {what}")

    def address(value, port, what: str) -> str:
        return haproxy_address(value, port, f"haproxy.cfg: {what}")

    rendered = [dict(b, name=word(b["name"], "a backend"),
                     bind=address(b["bind"], b["port"], f"{b['name']}'s bind"),
                     servers=[[word(s[0], f"a server of {b['name']}"), address(s[1], s[2], f"{b['name']}'s {s[0]}"),
                               len(s) > 3 and s[3], len(s) > 4 and s[4]] for s in b["servers"]],
                     routes=[(word(r["route"]["model"], f"a model of {b['name']}"), word(r["name"], "a backend"))
                             for r in backends if (r.get("route") or {}).get("of") == b["name"]],
                     held=held(b["allow"] if "allow" in b else data.get("llama_server_allow")))
                for b in backends]
    return render("balancer-haproxy.cfg.j2", backends=rendered, stats_port=data["balancer_stats_port"],
                  key_file=GATEWAY_KEY, state_file=SERVER_STATE,
                  timeout=data["balancer_timeout_s"], inter=data["balancer_check_interval_ms"],
                  retry_after=RETRY_AFTER_S, model_twice=MODEL_TWICE, model_text=MODEL_KEY,
                  json_object=OBJECT)


def state_dropin(drain: str) -> str:
    """haproxy.service's drop-in (Debian's unit, its ExecReload re-stated): the servers' state saved
    by the drain helper ``drain`` before a start, a stop and a reload (which it sends itself, holding
    its lock until the new worker answers), so HAProxy's ``server-state-file`` (SERVER_STATE) brings
    a drained or maint server back as it was. To start afresh: stop HAProxy, remove SERVER_STATE, start."""
    return (f"# Installed by rigup (roles/balancer): HAProxy keeps its servers' state (drain, maint, health)\n"
            f"# across a reload or a restart ({SERVER_STATE}: stop, remove it, start, to start afresh).\n"
            "[Service]\n"
            f"ExecStartPre=-{drain} save-state\n"
            f"ExecStop=-{drain} save-state\n"
            "ExecReload=\n"
            "ExecReload=/usr/sbin/haproxy -Ws -f $CONFIG -c -q $EXTRAOPTS\n"
            f"ExecReload={drain} reload $MAINPID\n")
