"""rigup's library: what every role may use and no role owns.

- ``config``: role defaults, YAML group_vars, the form language, validation of a host's data
- ``gpu``: GPU facts, the card and model catalogues, the pure hardware plan
- ``models``: the ``models`` map (entry form, defaults, dest) and what serving reads of a model
- ``names``: paths and names several roles agree on (completion marker, guard file, hub token)
- ``refusal``: the refusal type preflight prints, and helpers to word refusals
- ``templates``, ``state``, ``files``, ``apt``, ``units``, ``gate``: rendering, reading host state
  once, managed files, apt, systemd instance probes and quoting, the serving health gate

Roles (``roles/<role>/``) import from here, never from each other.
"""
