"""YAML parsed by PyYAML's safe loader, in libyaml's C build where PyYAML has it, refusing what
YAML allows but a configuration never means (issue 47).

A converge parses about 40 files (every role's defaults, group_vars, the catalogues); the
pure-Python loader spent about 0.3 s of a one-host no-op converge's controller CPU on them, the
C one (the same safe constructor, the same errors with their marks) about a tenth of that.

Refused, with the line (a ``yaml.YAMLError`` whose ``problem_mark`` the callers name): a key given
twice in one mapping (PyYAML keeps the last one silently; a merge key's ``<<`` entries may still be
overridden, as YAML says), and a document whose aliases expand to more than :data:`MAX_NODES`
nodes (a dozen lines of nested aliases is a billion items to whatever walks the result), and a
number YAML 1.1 reads in a way nobody writing a configuration means (issue 61): ``1:30`` is 90 and
``1:30.5`` 90.5 (base 60), ``010`` is 8 (octal), ``0b1111110010001`` is 8081 (binary), ``0x1F91``
8081 (hex), ``8_0_8_1`` is 8081 and ``1_000`` 1000 (YAML 1.1 drops every ``_`` of a number: a typo
or a pasted id reads as another number): quote it, or write it as plain decimal. A configuration
writes its integers in decimal (a port, a count, watts, bytes), so every other form of an int is
refused, hex included; a float may have no ``_`` and no base 60. ``0o10`` is text in YAML 1.1.
"""

import re

import yaml
from yaml.constructor import ConstructorError

BASE = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MAX_NODES = 100_000
MERGE = "tag:yaml.org,2002:merge"
# what an int or float tag may be: plain decimal (an int: no leading zero; a float: no ``_``, no base 60)
_DECIMAL = {"int": re.compile(r"[-+]?(?:0|[1-9][0-9]*)"), "float": re.compile(r"[^_:]*")}
# how YAML 1.1 reads what is not plain decimal, for the error (the first that matches)
_KINDS = tuple((kind, re.compile(start)) for kind, start in (
    ("base 60", ".*:"), ("'_'-separated", ".*_"), ("binary", "[-+]?0b"), ("hex", "[-+]?0x"), ("octal", "[-+]?0")))


class LOADER(BASE):  # noqa: N801 (the name callers already import)
    """The safe loader, refusing duplicate keys."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue   # an unhashable key: the constructor's own error follows
                if first is not key_node:
                    raise ConstructorError(f"in the mapping from line {node.start_mark.line + 1}", node.start_mark,
                                           f"key {str(key)[:80]!r} given twice (lines {first.start_mark.line + 1} "
                                           f"and {key_node.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_number(self, node):
        kind = "int" if node.tag.endswith("int") else "float"
        construct = super().construct_yaml_int if kind == "int" else super().construct_yaml_float
        try:
            value = construct(node)
        except ValueError as e:   # an explicit !!int that is no number; int()'s 4300-digit limit
            raise ConstructorError(None, None, f"not a number: {str(e)[:80]}", node.start_mark) from None
        if not _DECIMAL[kind].fullmatch(node.value):
            named = next((k for k, start in _KINDS if start.match(node.value)), "non-decimal")
            raise ConstructorError(None, None, f"{node.value!r} is a YAML 1.1 {named} number ({value}): "
                                   "quote it, or write a plain decimal", node.start_mark)
        return value


LOADER.add_constructor("tag:yaml.org,2002:int", LOADER.construct_number)
LOADER.add_constructor("tag:yaml.org,2002:float", LOADER.construct_number)


def _expanded(node, budget: list[int]) -> None:
    """Count ``node``'s nodes as the result would hold them (an alias's nodes again each time)."""
    stack = [node]
    while stack:
        n = stack.pop()
        budget[0] -= 1
        if budget[0] < 0:
            raise ConstructorError(None, None, f"its aliases expand to more than {MAX_NODES} nodes", n.start_mark)
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            stack.extend(x for pair in n.value for x in pair)


def safe_load(text: str):
    """``yaml.safe_load(text)``, with :data:`LOADER`, duplicate keys and alias bombs refused."""
    loader = LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded(node, [MAX_NODES])
        return loader.construct_document(node)
    finally:
        loader.dispose()
