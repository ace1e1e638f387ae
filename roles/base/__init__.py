"""roles/base: what every rigup host needs before any other role runs.

What it does to a host:
- an apt drop-in that waits for dpkg's locks (unattended-upgrades) and retries downloads; its apt
  commands also wait for apt's other locks (lists, archives: rigup/apt.py ``waiting``);
- the packages in ``base_packages`` and ``base_extra_packages``;
- the ``rigup_user`` system user (no login shell, home in ``rigup_state_dir``);
- ``rigup_prefix`` (software, root-owned) and ``rigup_state_dir`` (root-written state, root:user 0750);
- a persistent journal when ``base_persistent_journal`` is true (journald restarted only when
  its drop-in changed), on hosts that run systemd (``plan["systemd"]``, from preflight, or read
  here when called without a plan): a rental container without it gets none.

Variables (roles/base/defaults.yml): base_packages, base_extra_packages, rigup_user,
rigup_prefix, rigup_state_dir, base_persistent_journal, apt_lock_timeout, apt_cache_seconds, apt_retry_delay.
"""

import shlex

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand, deploy
from rigup.role import Role
from rigup.probe import operation
from rigup.probe import systemd

from rigup import apt, files
from rigup.state import read_once, reading
from rigup.templates import render
from rigup.gpu.plan import Plan
from rigup.config import Config, role_defaults
from rigup.gpu.facts import Systemd
from roles.base.checks import CHECKS

__all__ = ["apply", "CHECKS"]


class PasswdEntry(FactBase):
    """``{"home", "shell"}`` of user ``user`` (``getent passwd``), or None."""

    def command(self, user: str) -> str:
        return f"getent passwd {shlex.quote(user)} || true"

    def process(self, output: list[str]) -> dict | None:
        cols = output[0].split(":") if output and output[0] else []
        return {"home": cols[5], "shell": cols[6]} if len(cols) == 7 else None


@reading(PasswdEntry, user="user_name")
@operation()
def system_user(user_name: str, home: str, shell: str = "/usr/sbin/nologin"):
    """A system user ``user_name`` with its own group, home ``home`` (not created) and ``shell``."""
    entry = read_once(PasswdEntry, user=user_name)
    if entry is not None and entry["shell"] == shell:
        # its home is where it was made: usermod cannot move the home of a user whose services
        # run, and the services keep their own state directories (StateDirectory=)
        host.noop(f"user {user_name} exists")
    elif entry is None:
        yield StringCommand("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", QuoteString(home),
                            "--shell", QuoteString(shell), QuoteString(user_name))
    else:
        yield StringCommand("usermod", "--shell", QuoteString(shell), QuoteString(user_name))


@deploy("base", data_defaults=role_defaults("base"))
def apply(plan: Plan, data: Config):
    with_systemd = plan["systemd"] if plan else host.get_fact(Systemd)  # preflight's plan saves a round trip
    apt_conf, journald_conf = "/etc/apt/apt.conf.d/80rigup", "/etc/systemd/journald.conf.d/rigup.conf"
    paths = [apt_conf, data["rigup_prefix"], data["rigup_state_dir"]] + ([journald_conf] if with_systemd else [])
    files.managed(name="apt: wait for the dpkg lock", dest=apt_conf, paths=paths,
                  text=render("base-apt.conf.j2", lock_timeout=data["apt_lock_timeout"]))
    apt.installed(
        name="Install base packages",
        packages=data["base_packages"] + data["base_extra_packages"],
        cache_seconds=data["apt_cache_seconds"],
        _retries=2,
        _retry_delay=data["apt_retry_delay"],
    )
    system_user(name=f"System user {data['rigup_user']}", user_name=data["rigup_user"], home=data["rigup_state_dir"])
    files.directory(name=f"Directory {data['rigup_prefix']}", path=data["rigup_prefix"], paths=paths)
    # root's: root-written state (the guard's tripped file, cmpunlocker's stamp) lives here, and the
    # service user may read it but not remove or replace it; services keep their own StateDirectory
    files.directory(name=f"Directory {data['rigup_state_dir']}", path=data["rigup_state_dir"], paths=paths,
                    user="root", group=data["rigup_user"], mode="750")
    if not with_systemd:
        return
    journald = files.managed(name="journald: keep the journal across reboots", dest=journald_conf, paths=paths,
                             text=render("base-journald.conf.j2",
                                         storage="persistent" if data["base_persistent_journal"] else "auto"))
    systemd.service(
        name="Restart journald",
        service="systemd-journald",
        restarted=True,
        _if=journald.did_change,
    )


ROLE = Role("base", apply, checks=CHECKS)
