"""What the roles declare they make on a host, read from their source (no host, no pyinfra run):
every call of rigup.files' ``managed``, ``program`` (the program and each module beside it, as
the ``managed`` calls it makes) and ``directory``, pyinfra's ``files.put`` (inside an operation), base's ``system_user``, rigup.services' ``running`` and rigup.apt's ``installed``,
with its arguments evaluated against a host's data and the module's own names, a name the same
function assigned before the call, and the items of a comprehension the call is in.

An argument is evaluated only when it calls nothing but the harmless few of ``PURE`` (no
operation runs, no file is read); one that cannot be evaluated (an operation's own parameter, a
fact's value) is :data:`UNKNOWN`. tests/unit/test_bench_ansible.py holds the Ansible playbook of
tests/bench/ansible/playbook.py to these declarations, so that a change in a role fails there.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path

from pyinfra.operations import files as pyinfra_files

from rigup import apt, files, services
from roles.base import system_user

ROOT = Path(__file__).resolve().parents[3]


class _Unknown:
    """A value known only on a host: any use of it in an expression fails (the expression is UNKNOWN)."""

    def __repr__(self):
        return "UNKNOWN"

    def _fail(self, *args):
        raise LookupError("not known without a host")

    __format__ = __str__ = __getattr__ = __getitem__ = __iter__ = __add__ = __radd__ = __bool__ = _fail


UNKNOWN = _Unknown()
PURE = {"format", "rstrip", "lstrip", "strip", "split", "get", "items", "keys", "values", "zip", "sorted", "str", "int",
        "list"}


@dataclass
class Declared:
    """One call: ``what`` (file, dir, user, service, packages), its arguments, where it is."""

    what: str
    args: dict
    where: str


def _calls() -> dict:
    """The callables read, by identity -> what they declare."""
    return {files.managed: "file", files.program: "program", files.directory: "dir", pyinfra_files.put._inner: "file",
            system_user: "user", services.running: "service", apt.installed: "packages"}


class _Data(dict):
    """Host data as ``host.data`` reads it (``d.rigup_prefix``)."""

    def __getattr__(self, name):
        return self[name]


def _evaluable(expr: ast.AST) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name not in PURE:
                return False
        if isinstance(node, (ast.Lambda, ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom)):
            return False
    return True


def _eval(expr: ast.AST, env: dict):
    if not _evaluable(expr):
        return UNKNOWN
    try:
        return eval(compile(ast.Expression(expr), "<role>", "eval"), env)  # noqa: S307 - the roles' own source
    except Exception:  # noqa: BLE001 - a name bound only on a host (a fact, an operation's parameter)
        return UNKNOWN


def _bind(target: ast.AST, value, env: dict) -> None:
    if isinstance(target, ast.Name):
        env[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        items = [UNKNOWN] * len(target.elts)
        if value is not UNKNOWN and len(list(value)) == len(target.elts):
            items = list(value)
        for t, v in zip(target.elts, items):
            _bind(t, v, env)


class _Reader:
    def __init__(self, module, data: dict):
        self.module, self.data, self.found = module, data, []
        self.calls = _calls()
        self.path = Path(module.__file__).resolve().relative_to(ROOT)

    def env(self, fn: ast.FunctionDef) -> dict:
        """The function's names: the module's, the host's data, its other parameters unknown."""
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
        return {**vars(self.module), **dict.fromkeys(params, UNKNOWN), "data": dict(self.data), "d": _Data(self.data)}

    def block(self, body: list[ast.stmt], env: dict) -> None:
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(stmt, ast.Assign):
                self.scan(stmt.value, env)
                for target in stmt.targets:
                    if not (isinstance(target, ast.Name) and target.id in ("data", "d")):
                        _bind(target, _eval(stmt.value, env), env)
                continue
            inner = [getattr(stmt, k) for k in ("body", "orelse", "finalbody")
                     if isinstance(getattr(stmt, k, None), list)]
            inner += [h.body for h in getattr(stmt, "handlers", [])]
            if not inner:
                self.scan(stmt, env)
                continue
            for k in ("test", "iter"):
                if getattr(stmt, k, None) is not None:
                    self.scan(getattr(stmt, k), env)
            for item in getattr(stmt, "items", []):
                self.scan(item.context_expr, env)
            if isinstance(stmt, ast.For):
                _bind(stmt.target, UNKNOWN, env)
            for part in inner:
                self.block(part, env)

    def scan(self, node: ast.AST, env: dict) -> None:
        if isinstance(node, ast.Call):
            target = _eval(node.func, env) if isinstance(node.func, (ast.Name, ast.Attribute)) else UNKNOWN
            if any(target is c for c in self.calls):
                self.record(node, target, env)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and len(node.generators) == 1:
            gen = node.generators[0]
            try:
                items = list(_eval(gen.iter, env))
            except (TypeError, LookupError):   # not a sequence, or UNKNOWN
                items = [UNKNOWN]
            for item in items:
                inner = dict(env)
                _bind(gen.target, item, inner)
                self.scan(node.elt, inner)
            return
        for child in ast.iter_child_nodes(node):
            self.scan(child, env)

    def record(self, call: ast.Call, target, env: dict) -> None:
        params = inspect.signature(target).parameters
        args = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        args.update({k.arg: _eval(k.value, env) for k in call.keywords if k.arg})
        args.update({name: _eval(a, env) for name, a in zip(params, call.args)})
        kind = next(v for c, v in self.calls.items() if c is target)
        if kind == "program":   # rigup.files.program: a managed file each, the program's mode, the others' 0644
            where, beside = f"{self.path}:{call.lineno}", args["beside"]
            if args["dest"] is UNKNOWN or beside is UNKNOWN:
                self.found.append(Declared("file", {"dest": UNKNOWN, "mode": args["mode"]}, where))
                return
            for i, dest in enumerate(files.program_paths(args["dest"], beside)):
                name = args["name"] if not i or args["name"] is UNKNOWN else \
                    f"{args['name']}: {files.beside_name(beside[i - 1])} beside it ({beside[i - 1]})"
                self.found.append(Declared("file", {"dest": dest, "name": name, "mode": "644" if i else args["mode"],
                                                    "user": "root", "group": "root"}, where))
            return
        self.found.append(Declared(kind, args, f"{self.path}:{call.lineno}"))


def declared(module_names: list[str], data: dict) -> list[Declared]:
    """Every declaring call in the top-level functions of ``module_names``, evaluated with ``data``."""
    out = []
    for name in module_names:
        module = importlib.import_module(name)
        reader = _Reader(module, data)
        for node in ast.parse(inspect.getsource(module)).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                reader.block(node.body, reader.env(node))
        out += reader.found
    return out
