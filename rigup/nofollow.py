"""Root never follows what the rigup user can place (issue 32): how root reads the directories
that user writes, and where it does.

The rigup user (``rigup_user``) owns, on hosts with systemd, each model's directory (``dest``, and
a revision's ``.NAME@REV12`` next to it) with everything inside it: the marker, ``.rigup-fetch/``
(job.json, progress.json, state.json, lock, parts/, ckpt/) and the files (without systemd the
jobs, and so those directories, are root's); and the serving units' ``StateDirectory`` and
``CacheDirectory`` (``/var/lib/rigup/{llama-server,vllm}/NAME``, ``/var/cache/rigup/...``), which
only systemd touches. It can also write ``/tmp``, ``/var/tmp`` and ``/dev/shm``. Everything else
rigup makes is root's: ``rigup_prefix``, ``llama_cpp_dir``
(builds, smoke logs), the ccache, ``vllm_dir``, ``rigup_state_dir`` (root:rigup 0750),
``/etc/rigup`` (its key directories root:rigup 0750), ``/run/rigup`` (the converge lock), the
node exporter's textfile directory. A model's ``dest`` is refused inside any of those, inside
another model's, or under a directory another user can write (roles/model_fetch/checks.py
``check_dest``, and the probe's ``unsafe_parent`` on the host).

What root does there, what a planted symlink or FIFO did before, and what it does now: the table
:data:`PLACES`, data that tests/unit/test_nofollow.py holds to the code (every function it names
exists; every module that reads or writes what that user can place is in it), rendered as
docs/nofollow.md by ``make docs``. Tested on the lab by tests/roles/test_hostile.py and
test_tune.py. "As its owner": the directory's owner's rights (fetcher.py ``as_owner``, a child that
drops root; ``rigup_as_owner`` below, setpriv), so that a link reaches nothing that user could not
read.

pyinfra's own uploads with ``_sudo`` (pyinfra/api/host.py ``get_temp_filename``): config.py
(tests/unit/test_temp_uploads.py). Root-side reads of
root's own files (units, keys, configs) are unchanged. The kernel's ``fs.protected_symlinks``,
``protected_fifos``, ``protected_hardlinks`` and ``protected_regular`` guard sticky world-writable
directories and hard links when set; rigup does not rely on them.
"""

from __future__ import annotations

import shlex
from typing import NamedTuple


class Place(NamedTuple):
    """Where root meets what another user can place: ``step`` (what root does), ``code`` (the
    file and function or class doing it: ``path/to/file.py:name``), ``before`` (what a planted
    symlink or FIFO did; "seen": run on a lab host with the code before the change) and ``now``."""
    step: str
    code: str      # one or more, ", "-separated
    before: str
    now: str


PLACES: tuple[Place, ...] = (
    Place("install -d -o rigup dest dest/.rigup-fetch", "roles/model_fetch/__init__.py:fetched",
          ".rigup-fetch -> /root/d: chown rigup, mode 755 of the target (seen)",
          "dest by root, only under directories only root can write (else refused); inside it everything by "
          "the rigup user (runuser)"),
    Place("job.json written", "roles/model_fetch/__init__.py:job_written",
          "files.put (sftp as root, then chmod 644) through job.json -> /root/f: the target overwritten with the "
          "job, made 0644 (seen)", "written by the rigup user to a new name (mktemp), renamed over job.json"),
    Place("rm -f progress.json; a restart's flock of the lock", "roles/model_fetch/__init__.py:fetched",
          "the link removed (safe); flock creates a missing target (O_CREAT), a FIFO blocks the converge",
          "by the rigup user; with systemd `systemctl stop` alone; the lock read only in root's own directory "
          "(no systemd)"),
    Place("the probe's reads of a model's directory", "roles/model_fetch/shipped/fetcher.py:probe",
          "marker, job/progress/state JSON and the lock read through links (root-only JSON in the fact's "
          "output); a FIFO hangs it", "as its owner, every open no-follow and non-blocking; each plant named, and "
          "the host refused (plan.py planted_problems)"),
    Place("preflight's bytes of a model's files", "roles/preflight/facts.py:PathBytes",
          "grep of the marker: a FIFO hangs the converge (seen: killed after 60 s)",
          "read_file; du reads no file and follows no link below its argument"),
    Place("the serving roles' marker reads", "rigup/units.py:instance_probe, roles/llama_server/facts.py:LlamaServerState, roles/vllm/facts.py:VllmState",
          "cat of the marker: a FIFO hangs, a link puts root-only text in the output", "read_file"),
    Place("rigup-model-metrics (a root timer)", "roles/model_fetch/shipped/fetcher.py:metrics",
          "the same reads; a FIFO hangs each run to TimeoutStartSec (60 s), no metrics",
          "as its owner, non-blocking (1 s)"),
    Place("rigup-fetch prune (root)", "roles/model_fetch/shipped/fetcher.py:prune",
          "opens each old revision's lock (a FIFO hangs); rmtree was safe already",
          "revisions listed as their owner; rmtree never follows a link"),
    Place("rigup-fetch switch (root)", "roles/model_fetch/shipped/fetcher.py:switch", "renames in root's directory only (safe)",
          "unchanged"),
    Place("the llama.cpp smoke (root)", "roles/llama_cpp/shipped/smoke.py:model_of",
          "opens the marker: a FIFO hangs the smoke to its timeout, the host fails",
          "no-follow, non-blocking, a regular file only; llama-server itself runs as the rigup user"),
    Place("status.py's download progress", "roles/model_fetch/facts.py:progress_command",
          "head, grep, flock as above", "read_file; flock as its owner under a 5 s timeout"),
    Place("bench.py's marker and llama-bench", "plays/bench.py:LlamaBench",
          "tr < marker; llama-bench (root) opens the model file through any link",
          "read_file; llama-bench as the owner of the model's directory"),
    Place("cuda_toolkit's keyring", "roles/cuda_toolkit/__init__.py:keyring",
          "/tmp/cuda-keyring.deb: a fixed name in /tmp, written by curl, then dpkg -i",
          "a directory of its own (mktemp -d)"),
    Place("tune.py's scripts, each spec, log and done marker; the sweep's result", "plays/tuning.py:Unsafe, tune.py:keep",
          "its directory was the rigup user's: the spec uploaded through a link (a root file overwritten, handed "
          "to the user), `: > log` truncating, `touch done` creating any file; cat of the result",
          "rigup_state_dir/tuner, root's (root:rigup 0750); anything there not root's regular file refused, named, "
          "before any change; the sweep (the rigup user) writes only in its out/, read by root as that user "
          "(read_file); the old tune/ removed"),
    Place("the host programs' files: the textfile collector's metrics, the watchdog's and the guard's state, "
          "the fetcher's JSON, rigup-burnin's records and metrics, rigup-balancer-drain's server state (in "
          "/run/haproxy, the haproxy group's) and leases", "roles/watchdog/shipped/watchdog.py:replace, "
          "roles/gpu_guard/shipped/guard.py:replace, roles/model_fetch/shipped/fetcher.py:replace, roles/burnin/shipped/acceptance.py:replace, "
          "roles/balancer/shipped/drain.py:replace",
          "open('.NAME.PID.tmp', 'w') beside the target: a link the directory's owner planted there (the node "
          "exporter's textfile directory, another user's) was followed: root's file overwritten, made 0644 (issue 61)",
          "a random dot-name opened O_CREAT|O_EXCL|O_NOFOLLOW (another on EEXIST), fchmod'ed, renamed over the "
          "target (a rename replaces a link there, never follows it); tests/unit/test_host_records.py, and "
          "tests/unit/test_host_programs.py: no other open for writing in a host program but a listed one"),
    Place("pyinfra's uploads with _sudo", "config.py:TEMP_DIR, rigup/__init__.py:_TEMP_DIR",
          "/tmp/pyinfra-<sha1 of the destination>, a name any local user can predict and occupy first",
          "the login user's home (pyinfra's TEMP_DIR '.'); a host reached as root uploads straight to the "
          "destination; a run whose TEMP_DIR is not '.' (from outside the checkout: config.py unread) is "
          "refused when it imports rigup"),
    Place("a host program's import of the one beside it (root runs the guard, the relay, the watchdog, the "
          "burn-in, the sweep)",
          "roles/burnin/shipped/acceptance.py:beside, roles/gpu_guard/shipped/guard.py:beside, roles/metrics/shipped/relay.py:beside, "
          "roles/watchdog/shipped/watchdog.py:beside, plays/shipped/tune.py:beside",
          "sys.path inserts and importlib by path: a link, a FIFO or a file another user could write was run "
          "(round 8)", "opened O_NOFOLLOW|O_NONBLOCK and run only as a regular file of root's (or the running "
          "user's) that no group or other user may write; else ImportError naming the file"),
)


def table() -> str:
    """:data:`PLACES` as a Markdown table (docs/nofollow.md)."""
    def where(ref: str) -> str:
        path, name = ref.split(":")
        return f"`{path}` {name}"
    rows = [f"| {p.step} | {', '.join(where(c) for c in p.code.split(', '))} | {p.before} | {p.now} |" for p in PLACES]
    return "\n".join(["| root's step | where | a planted symlink or FIFO, before | now |",
                      "| --- | --- | --- | --- |", *rows]) + "\n"

AS_OWNER, READ = "rigup_as_owner", "rigup_read"   # the shell functions of :data:`FUNCTIONS`
# ``rigup_as_owner DIR CMD...``: CMD run as the owner of the directory DIR (root's links followed)
# when the shell is root's and DIR is not (setpriv: no login, no PAM), else CMD itself (DIR is
# root's, or not there): what another user can place in DIR is read only with that user's rights.
# ``rigup_read DIR PATH LIMIT``: at most LIMIT bytes of the file PATH in DIR, read as DIR's owner,
# never through a symlink at PATH, never waiting on a FIFO (dd's nofollow, nonblock); else nothing.
FUNCTIONS = (f'{AS_OWNER}() {{ o=$(stat -L -c %u:%g -- "$1" 2>/dev/null) || o=0:0; shift; '
             'if [ "${o%:*}" != 0 ] && [ "$(id -u)" = 0 ]; then '
             'setpriv --reuid="${o%:*}" --regid="${o#*:}" --clear-groups -- "$@"; else "$@"; fi; }; '
             f'{READ}() {{ {AS_OWNER} "$1" dd if="$2" iflag=nofollow,nonblock bs="$3" count=1 status=none 2>/dev/null; }}')


def read_file(folder: str, path: str, limit: int = 1 << 20) -> str:
    """Shell printing at most ``limit`` bytes of the file ``path`` in the model directory ``folder``
    (``rigup_read``; the command defines :data:`FUNCTIONS` first)."""
    q = shlex.quote
    return f"{READ} {q(folder)} {q(path)} {int(limit)}"
