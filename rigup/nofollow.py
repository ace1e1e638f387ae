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

What root does there, what a planted symlink or FIFO did before, and what it does now (tested by
tests/roles/test_hostile.py on the lab, tests/unit/test_nofollow.py). "Seen": run on a lab host
with the code before this change.
"As its owner": the directory's owner's rights (fetcher.py ``as_owner``, a child that drops root;
``rigup_as_owner`` below, setpriv), so that a link reaches nothing that user could not read.

========================================  ==========================================  =============================================
root's step (where)                       a planted symlink / FIFO, before            now
========================================  ==========================================  =============================================
``install -d -o rigup dest dest/.rigup-   ``.rigup-fetch`` -> /root/d: chown rigup,   dest by root, only under directories only
fetch`` (model_fetch ``fetched``)         mode 755 of the target (seen)               root can write (else refused); inside it
                                                                                      everything by the rigup user (runuser)
job.json (``files.put``: sftp as root,    ``job.json`` -> /root/f: the target         written by the rigup user to a new name
then chmod 644)                           overwritten with the job, made 0644 (seen)  (mktemp), renamed over job.json
``rm -f progress.json``                   the link removed (safe)                     by the rigup user
restart: ``flock lock``, ``head lock``    flock creates a missing target (O_CREAT);   with systemd ``systemctl stop`` alone; the lock
                                          a FIFO blocks the converge                  read only in root's own directory (no systemd)
probe fact ``ModelFetchState``            marker, job/progress/state JSON and the     as its owner, every open no-follow and
(fetcher.py ``probe``)                    lock read through links (root-only JSON     non-blocking; each plant named, and the host
                                          in the fact's output); a FIFO hangs it      refused (plan.py ``planted_problems``)
preflight ``PathBytes``                   ``grep`` of the marker: a FIFO hangs the    :func:`read_file`; ``du`` reads no file and
                                          converge (seen: killed after 60 s)          follows no link below its argument
llama_server, vllm facts                  ``cat`` of the marker: a FIFO hangs, a      :func:`read_file`
(rigup/units.py ``instance_probe``)       link puts root-only text in the output
``rigup-model-metrics`` (root timer)      the same reads; a FIFO hangs each run to    as its owner, non-blocking (1 s)
                                          TimeoutStartSec (60 s), no metrics
``rigup-fetch prune`` (root)              opens each old revision's lock (FIFO:       revisions listed as their owner; rmtree never
                                          hangs); rmtree was safe already             follows a link
``rigup-fetch switch`` (root)             renames in root's directory only (safe)     unchanged
llama_cpp smoke (smoke.py, root)          opens the marker: a FIFO hangs the smoke    no-follow, non-blocking, a regular file only;
                                          to its timeout, the host fails              llama-server itself runs as the rigup user
status.py (``progress_command``)          ``head``, ``grep``, ``flock`` as above      :func:`read_file`; flock as its owner under a
                                                                                      5 s timeout
bench.py ``Serving``, ``LlamaBench``      ``tr < marker``; llama-bench (root) opens   :func:`read_file`; llama-bench as the owner
                                          the model file through any link             of the model's directory
cuda_toolkit's keyring                    ``/tmp/cuda-keyring.deb``: a fixed name in  a directory of its own (``mktemp -d``)
                                          /tmp, written by curl, then ``dpkg -i``
tune.py (root: its scripts, each          its directory was the rigup user's: the     ``rigup_state_dir/tuner``, root's (root:rigup
spec, log and done marker; the            spec uploaded through a link (a root file   0750); anything there not root's regular
sweep's result read)                      overwritten, handed to the user), ``: >     file refused, named, before any change; the
                                          log`` truncating, ``touch done`` creating   sweep (the rigup user) writes only in its
                                          any file; ``cat`` of the result             ``out/``, read by root as that user
                                                                                      (:func:`read_file`); the old ``tune/`` removed
========================================  ==========================================  =============================================

pyinfra's own uploads with ``_sudo`` went through ``/tmp/pyinfra-<sha1 of the destination>``
(pyinfra/api/host.py ``get_temp_filename``), a name any local user can predict and occupy first;
config.py now sets pyinfra's TEMP_DIR to the login user's home (tests/unit/test_temp_uploads.py),
and a host reached as root over SSH (the lab) uploads straight to the destination. Root-side reads of
root's own files (units, keys, configs) are unchanged. The kernel's ``fs.protected_symlinks``,
``protected_fifos``, ``protected_hardlinks`` and ``protected_regular`` guard sticky world-writable
directories and hard links when set; rigup does not rely on them.
"""

from __future__ import annotations

import shlex

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
