"""YAML parsed by PyYAML's safe loader, in libyaml's C build where PyYAML has it.

A converge parses about 40 files (every role's defaults, group_vars, the catalogues); the
pure-Python loader spent about 0.3 s of a one-host no-op converge's controller CPU on them, the
C one (the same safe constructor, the same errors with their marks) about a tenth of that.
"""

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load(text: str):
    """``yaml.safe_load(text)``, with :data:`LOADER`."""
    return yaml.load(text, Loader=LOADER)  # noqa: S506 (a safe loader)
