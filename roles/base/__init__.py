"""roles/base: what every rigup host needs before any other role runs.

What it does to a host:
- an apt drop-in that waits for the dpkg lock (unattended-upgrades) and retries downloads;
- the packages in ``base_packages`` and ``base_extra_packages``;
- the ``rigup_user`` system user (no login shell, home in ``rigup_state_dir``);
- ``rigup_prefix`` (software, root-owned) and ``rigup_state_dir`` (state, owned by the user);
- a persistent journal when ``base_persistent_journal`` is true (journald restarted only when
  its drop-in changed), on hosts that run systemd (``plan["systemd"]``, from preflight, or read
  here when called without a plan): a rental container without it gets none.

Variables (roles/base/defaults.yml): base_packages, base_extra_packages, rigup_user,
rigup_prefix, rigup_state_dir, base_persistent_journal, apt_lock_timeout, apt_cache_seconds.
"""

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.operations import files, server, systemd

from roles.common import apt, template
from roles.config import role_defaults
from roles.gpu.facts import Systemd


@deploy("base", data_defaults=role_defaults("base"))
def apply(plan: dict | None = None):
    d = host.data
    files.template(
        name="apt: wait for the dpkg lock",
        src=template("base-apt.conf.j2"),
        dest="/etc/apt/apt.conf.d/80rigup",
        lock_timeout=d.apt_lock_timeout,
    )
    apt.installed(
        name="Install base packages",
        packages=d.base_packages + d.base_extra_packages,
        cache_seconds=d.apt_cache_seconds,
        _retries=2,
        _retry_delay=10,
    )
    server.user(
        name=f"System user {d.rigup_user}",
        user=d.rigup_user,
        system=True,
        home=d.rigup_state_dir,
        shell="/usr/sbin/nologin",
        create_home=False,
    )
    files.directory(name=f"Directory {d.rigup_prefix}", path=d.rigup_prefix,
                    user="root", group="root", mode="755")
    files.directory(name=f"Directory {d.rigup_state_dir}", path=d.rigup_state_dir,
                    user=d.rigup_user, group=d.rigup_user, mode="750")
    if not (plan["systemd"] if plan else host.get_fact(Systemd)):  # preflight's plan saves a round trip
        return
    journald = files.template(
        name="journald: keep the journal across reboots",
        src=template("base-journald.conf.j2"),
        dest="/etc/systemd/journald.conf.d/rigup.conf",
        storage="persistent" if d.base_persistent_journal else "auto",
    )
    systemd.service(
        name="Restart journald",
        service="systemd-journald",
        restarted=True,
        _if=journald.did_change,
    )
