"""A play of some of deploy.py's steps (roles/__init__.py STEPS), named by RIGUP_LAB_STEPS
(comma-separated, e.g. ``base.apply,llama_cpp.apply``): preflight always runs first. For the lab
tests and benches that time one part of a converge alone (tests/roles/test_progress.py,
tests/bench_overlap.py)."""

import os

from pyinfra import host

from rigup.config import configure
from roles import STEPS, in_order, preflight, steps

cfg = configure(host, in_order())
wanted = os.environ["RIGUP_LAB_STEPS"].split(",")
unknown = sorted(set(wanted) - set(STEPS))
if unknown:
    raise SystemExit(f"RIGUP_LAB_STEPS: not steps of roles.STEPS: {', '.join(unknown)}")
plan = preflight.run(in_order(), cfg)
if host not in host.state.failed_hosts:
    for name, step in host.loop(zip(STEPS, steps())):   # as deploy.py does
        if name in wanted:
            step(plan, cfg)
