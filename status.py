"""The fleet in one table, one row per host, each read in one round trip; changes nothing.

    pyinfra inventory/lab.py status.py                       # a table, sorted by host name
    pyinfra inventory/lab.py status.py --data status_format=json

Per host: its cards (count x class), their total draw / limit and the hottest card's temperature,
VRAM used, the llama.cpp build that serves (llama_cpp_dir/current), each serving instance
(rigup-llama@*, rigup-vllm@*: state, /health's code at its port, model@revision; a router's loaded
models; a model it pins, its own server NAME.M), the models
downloaded of those configured, the GPU guard (tripped or not) and rigup_maintenance, and the
host's joules per generated token while it generates (read from the monitoring hosts' Prometheus,
rigup:host_joules_per_token, when the inventory has one); in 120
columns for a typical host (plays/fleet.py). What is wrong comes first: a line above the table
names the hosts that need attention, and under a host's row, indented, each card that needs
attention (its PCIe link downtrained, Xid events this boot by class, suspect, telemetry lost: the
GPU guard's Xid state; quarantined by its burn-in, roles/burnin), the guard's reason when tripped and each model not downloaded (progress
or failure, as roles/model_fetch reads them). A host that cannot be reached is a row
``unreachable (reason)``, and the run ends non-zero.
"""

from pyinfra import host

from plays import fleet
from rigup.config import check_host, host_only
from rigup.models import models as model_entries
from rigup.names import burnin_file, guard_file, xid_file
from roles.metrics.prometheus import bind_address, url_host
from roles.model_fetch import specs
from roles.model_fetch.facts import parse_progress, progress_command
from roles.model_fetch.plan import short_progress

with host_only(host):   # a configuration error fails this host, named, not the run
    data = check_host(host)   # the host's configuration (rigup.config.Config)
    models = model_entries(data)[0]
    parts = {"gpus": fleet.SMI, "build": fleet.build_section(data["llama_cpp_dir"]), "serving": fleet.SERVING,
             "guard": fleet.guard_section(guard_file(data), xid_file(data)), "watchers": fleet.WATCHERS_SECTION}
    if data["burnin_enabled"]:
        parts["burnin"] = fleet.burnin_section(burnin_file(data))
    fetches = specs(data, models)
    if fetches:
        parts["fetch"] = progress_command(fetches)
    instances = fleet.configured(host.name, data)   # an entry not of its form: said, and left out
    routers = [name for var, name, inst in instances if var == "llama_server_instances" and inst["also"]]
    if data["metrics_enabled"] and routers:   # the loads each router's relay counted
        parts["loads"] = fleet.loads_section(
            f"http://{url_host(bind_address(host.name, data, 'metrics_address'))}:{data['metrics_relay_port']}", routers)
    if data["prometheus_enabled"]:
        parts["energy"] = fleet.energy_section(
            f"http://{url_host(bind_address(host.name, data, 'prometheus_address'))}:{data['prometheus_port']}")
    found = host.get_fact(fleet.FleetStatus, parts=parts)
    fleet.record_energy(host.state, fleet.parse_energy(found.get("energy", [])))
    probed = parse_progress(found.get("fetch", []), fetches)
    configured = fleet.served_models(instances)   # a router's pinned model too: its own server, NAME.M
    fleet.record(host.state, fleet.host_row(host.name, found, downloads=[short_progress(n, probed.get(n, {})) for n in models],
                                            maintenance=data["rigup_maintenance"], models=configured,
                                            tuned=data.get("llama_server_tuned"), burnin_at=burnin_file(data),
                                            burnin_every_days=data.get("burnin_every_days") if data["burnin_enabled"] else None),
                 data["status_format"])
