"""The lab's inventory (inventory/lab.py) with its first host also in the group `monitoring`
(group_vars/monitoring.yml: it runs Prometheus, scraping every lab host), its Prometheus bound to
its inventory address (behind its allow-list) rather than loopback."""

from inventory.lab import _host, _lab, a100, cmp170hx, h100, lab, none  # noqa: F401 (groups)
from rigup.config import all_group as _all_group

monitoring = ([_host(h) for h in _lab["hosts"][:1]], {"prometheus_address": None})
all = _all_group(globals())
