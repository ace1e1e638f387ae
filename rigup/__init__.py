"""rigup's library: what every role may use and no role owns. The plays' engines are not here
(plays/: status.py's report, roll.py's batches and inventory reader, bench.py's and tune.py's pieces,
the charts); nothing here imports from plays/.

- ``config``: role defaults, YAML group_vars, the form language, validation of a host's data;
  ``entries``: the forms of nested entries; ``yamlfile``: YAML read strictly
- ``role``: the record each role declares (``Role``); ``run``: a run's state, in one object
- ``contract``: one contract per serving engine (every instance key in one table, each serving
  map's key file); standard library only
- ``instances``: each serving engine's entry form and its instances, normalised, tuned and
  checked: the one shape of an instance, read by the engines' roles, the serving plan, the
  metrics, the watchdog, ``rpc``, plays/bench.py, the balancer and status.py (``every``: both engines')
- ``serving``: the serving plan (``serving_plan``) and the walk every serving engine takes (``serve``)
- ``gpu``: GPU facts, the card and model catalogues, the pure hardware plan; ``cuda``: the CUDA
  toolkit's packages by source
- ``models``: the ``models`` map (entry form, defaults, dest) and what serving reads of a model
- ``names``: paths and names several roles agree on (completion marker, guard file, hub token)
- ``refusal``: the refusal type preflight prints, and helpers to word refusals; ``traps``: the
  catalogues of known traps
- ``boundary``: the one boundary for what crosses in from outside (numbers, fields, JSON records,
  formats written); ``nofollow``: how root reads what the rigup user can write, and where;
  ``text``: text from outside made safe for the terminal, and every line for the operator (``say``)
- ``templates``, ``state``, ``files``, ``apt``, ``services``, ``units``, ``gate``: rendering, reading
  host state once, managed files, apt, running services, systemd instance probes and quoting, the
  serving health gate; ``probe``: a converged role costs no pyinfra operation; ``playfile``: the
  play file pyinfra runs, for ``inspect``
- ``lock``: one controller at a time per host; ``progress``: long work as a background job whose
  progress the converge prints; ``summary``: one line per host at a play's end
- ``peer``: another host of the run, as its own preflight plans it; ``rpc``: llama.cpp RPC across
  hosts; ``firewall``: nftables allow-lists; ``secrets``: API keys made on the host, files sent on stdin

Nothing here is sent to a host: the programs that run on hosts live in ``shipped/`` folders (each
role's, plays/shipped/ and the top-level shipped/ for the modules several share: docs/layout.md),
installed or sent by ``files`` (``program``, ``program_text``). Roles (``roles/<role>/``) import
from here, never from each other.
"""

import sys as _sys

# pyinfra's CLI turns bytecode writing off for the whole process (pyinfra_cli/main.py: "don't
# write out deploy.pyc"), so every run compiled rigup's ~90 modules again: about 0.2 s of the
# controller's CPU in each converge. rigup is a package like any library; its modules (imported
# after this line) are cached in __pycache__ as Python does by default. pyinfra execs deploy.py
# and the inventory from source either way. PYTHONDONTWRITEBYTECODE=1 still turns it off.
if not _sys.flags.dont_write_bytecode:
    _sys.dont_write_bytecode = False

# In a pyinfra run (any play that imports rigup: deploy.py, status.py, tune.py, bench.py, with or
# without rigup's inventory), every record pyinfra prints is escaped for the terminal from here on
# (rigup.text.guard_terminal; pyinfra_cli has set up its log handler before it loads the inventory
# or a play); rigup.summary.watch covers a handler added later. So is what pyinfra echoes beside
# its log (each command's output at -vv/-vvv), and the colours kept are pyinfra's own
# (rigup.text.guard_output).
if "pyinfra_cli" in _sys.modules:
    from rigup.text import guard_output as _guard_output, guard_terminal as _guard_terminal

    _guard_terminal()
    _guard_output()

    # issue 47: config.py's TEMP_DIR "." keeps pyinfra's uploads for _sudo out of a predictable
    # /tmp/pyinfra-<sha1>; pyinfra_cli reads config.py from the directory it runs in only, so a run
    # from elsewhere (or with another --config) stops here, before any host is touched, saying where
    # to run it. Set here instead, pyinfra would drop it again after the deploy file that imported
    # rigup (Config.reset_locked_state).
    import pyinfra as _pyinfra
    from pyinfra.context import ctx_config as _ctx_config

    _TEMP_DIR = "."   # config.py's
    if _pyinfra.is_cli and _ctx_config.isset() and _pyinfra.config.TEMP_DIR != _TEMP_DIR:
        from pathlib import Path as _Path

        from pyinfra.api.exceptions import PyinfraError as _PyinfraError

        raise _PyinfraError(
            f"rigup's plays run from the checkout (cd {_Path(__file__).resolve().parents[1]}): pyinfra reads "
            f"config.py from the directory it runs in, and its TEMP_DIR '.' keeps uploads for _sudo out of "
            f"/tmp (issue 47); this run's TEMP_DIR is {_pyinfra.config.TEMP_DIR!r}")
