"""roles/model_fetch's download metrics on the lab: a download that fails for real (the
filesystem under it fills up) reaches Prometheus on the monitoring host as
rigup_model_fetch_state{state="failed"} with its error, through the node exporter's textfile
directory (rigup-model-metrics.timer, no new daemon); ModelDownloadFailed is loaded, fires, and
resolves once the disk is freed and a converge completes the model.

The play is preflight + base + model_fetch + metrics (no llama.cpp build); the hub is the lab's.
"""

import time

import pytest

from tests.conftest import on_host
from tests.roles.test_fetch_faults import MID
from tests.roles.test_model_fetch import progress, wait_for
from tests.roles.watch_lab import api, play, until

pytestmark = pytest.mark.lab
EVERY_S = 2
FAST = {"prometheus_alert_for_s": 2, "prometheus_scrape_interval_s": EVERY_S, "model_fetch_metrics_interval_s": EVERY_S,
        "llama_server_instances": {}, "model_fetch_wait_timeout": 600}
FULL = "/mnt/fetch-metrics"
FAILED = 'rigup_model_fetch_state{{host="{}",model="mid",state="{}"}} == 1'


def firing(lab, monitor, name, host):
    return [a for a in api(lab, monitor, "alerts")["alerts"]
            if a["labels"]["alertname"] == name and a["labels"].get("host") == host and a["state"] == "firing"]


def test_a_failed_download_reaches_prometheus_and_fires_its_alert(lab, tmp_path):
    from tests.lab import hub as hub_module

    hub_module.serve()
    monitor, other = [h["name"] for h in lab.hosts()][:2]
    config = hub_module.CACHE / "tiny-config.json"
    lab.write(config, '{"architectures": ["LlamaForCausalLM"]}\n')
    rev = hub_module.publish("lab/mid", {"mid.bin": hub_module.random_file("mid-64m.bin", MID), "config.json": config})
    dest = f"{FULL}/mid"
    on_host(lab, other, f"mkdir -p {FULL} && (mountpoint -q {FULL} && umount {FULL}; true) && "
                        f"mount -t tmpfs -o size=80m,mode=755 tmpfs {FULL}")
    mid = {"mid": {"repo": "lab/mid", "revision": rev, "include": ["mid.bin"], "dest": dest}}
    data = {monitor: dict(FAST), other: {**FAST, "models": mid}}
    hub_module.reset()
    hub_module.rate(256 << 10)       # slow enough that the converge ends long before the file does
    try:
        run = play(tmp_path, ["model_fetch", "metrics"], data, monitoring=True)
        print(f"\nconverge (model_fetch + metrics, Prometheus on {monitor}): {run.seconds:.1f} s")
        wait_for(lambda: progress(lab, other, dest).get("bytes", 0) >= 1 << 20, 120, "1 MiB of the file")
        on_host(lab, other, f"fallocate -l $(( $(df --output=avail -B1 {FULL} | tail -1) - (1 << 20) )) {FULL}/filler")
        filled = time.monotonic()
        wait_for(lambda: progress(lab, other, dest).get("state") == "failed", 120, "the job to fail")
    finally:
        hub_module.rate(0)
    failed_s = time.monotonic() - filled
    assert until(lambda: api(lab, monitor, "query", query=FAILED.format(other, "failed"))["result"], 60), \
        "the failed state never reached Prometheus"
    seen_s = time.monotonic() - filled
    error = api(lab, monitor, "query", query="rigup_model_fetch_error_info")["result"]
    print(f"disk filled: the job failed after {failed_s:.1f} s, Prometheus had it after {seen_s:.1f} s: "
          f"error={error[0]['metric']['error']!r}")
    assert error[0]["metric"]["host"] == other and "no space left on device" in error[0]["metric"]["error"]
    rules = {r["name"]: r for g in api(lab, monitor, "rules")["groups"] for r in g["rules"]}
    assert {"ModelDownloadFailed", "ModelDownloadStalled"} <= set(rules)
    alert = until(lambda: firing(lab, monitor, "ModelDownloadFailed", other), 60)
    assert alert, "ModelDownloadFailed never fired"
    print(f"ModelDownloadFailed firing {time.monotonic() - filled:.1f} s after the disk filled: "
          f"{alert[0]['annotations']['summary']}")
    assert not firing(lab, monitor, "ModelDownloadFailed", monitor)
    # freed, converged again: the job completes, the metric says so, the alert resolves
    on_host(lab, other, f"rm {FULL}/filler")
    play(tmp_path, ["model_fetch", "metrics"], data, monitoring=True)
    freed = time.monotonic()
    assert until(lambda: api(lab, monitor, "query", query=FAILED.format(other, "complete"))["result"], 180)
    assert until(lambda: not firing(lab, monitor, "ModelDownloadFailed", other), 60)
    print(f"freed and converged: complete and the alert resolved {time.monotonic() - freed:.1f} s later")
    again = play(tmp_path, ["model_fetch", "metrics"], data, monitoring=True)
    print(f"converge again: {again.totals['changed']} changed")
    assert again.totals["changed"] == 0, again.changed_operations()
    on_host(lab, other, f"umount {FULL}")
