"""Files on the controller named by configuration (a key file, the artifact cache, a netrc, the site
directory and its YAML), used only when no other user could have written them (issue 61).

The rule is OpenSSH's StrictModes as Debian patches it (auth.c ``secure_permissions``): the file,
and every directory on its path up to ``/``, is owned by the operator running rigup (the effective
uid) or root and is writable by neither group nor others; group-writable passes when the group is
the owner's private group (its name is the owner's and it has no other member: a umask of 002 makes
such files). One difference: a directory on the path that is sticky (``/tmp``) may be writable by
others, because the kernel lets no one but an entry's owner rename or remove it there, and the
next component is checked itself; a directory named by configuration never may.

A POSIX ACL (the ``system.posix_acl_access`` attribute of the open descriptor) is held to the same
rule, since with one the mode's group bits are only the mask (``setfacl -m u:nobody:rw FILE`` shows
``-rw-rw----``): a ``user:`` entry letting another user than the owner or root write, or a ``group:``
entry (or the owning group's) letting a group other than the owner's private group write, each
effective under the ACL's mask, is refused, naming the entry and the fix (``setfacl -b FILE``); an
ACL of a format other than the kernel's version 2 is refused too. No attribute, or a file system
without ACLs, is no ACL.

Every component is opened without following a link (``O_NOFOLLOW``, each one relative to the
directory before it) and checked by ``fstat`` of the open descriptor, so what is checked is what is
read: a component swapped for a link between the check and the read is refused, not followed. A
link on the path (``~/.config`` -> elsewhere) is followed, component by component, only when it is
the operator's or root's; the file or directory named itself is never a link.
Anything else is :class:`NotOwned`, naming the file, what is wrong (owner, mode) and the fix,
raised before anything changes on a host.

Also here, :func:`write`, the one writer of what rigup keeps in a directory of its own on the
controller (the hub's answers, the burn-in copies, the artifact cache, the tuner's output), and the
two readers of what such files hold: :func:`key` (an API key or token, before it is
written anywhere) and :func:`netrc` (a netrc cut to the machines rigup fetches from).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import re
import shlex
import stat
import struct
from pathlib import Path

from rigup.boundary.core import Crossing, Unreadable

_DIR = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
LIMIT = 1 << 20      # a key, a netrc or a group_vars file is far smaller
# an API key or token: printable ASCII without quotes, backslash or whitespace (nothing a curl
# config, an env file, HAProxy's list or a header line reads more into), 16 to 512 characters; no
# ',' (HAProxy's req.hdr() splits a header there: the gateway refused the right key, issue 61, round 6
# FM13; llama-server's --api-key splits there too) and no '#' first (llama-server's --api-key-file
# skips such a line as a comment: the server would hold no key)
KEY = re.compile(r"(?!#)[!#-&(-+\--\[\]-~]{16,512}")


class NotOwned(Unreadable):
    """A file named by configuration that another user could have written: ``where`` (the key or
    variable naming it), ``why`` (the file, what is wrong, the fix)."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """Whether ``gid`` is the private group of ``uid``: named as the user, no other member (its
    members' list, and every user whose primary group it is)."""
    try:
        group, owner = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    if group.gr_name != owner.pw_name or any(m != owner.pw_name for m in group.gr_mem):
        return False
    return all(p.pw_uid == uid for p in pwd.getpwall() if p.pw_gid == gid)


# the kernel's ACL attribute (include/uapi/linux/posix_acl_xattr.h): a version, then (tag, perm, id) entries
_ACL, _ACL_VERSION, _ACL_ENTRY = "system.posix_acl_access", 2, struct.Struct("<HHI")
_USER, _GROUP_OBJ, _GROUP, _MASK, _WRITE = 0x02, 0x04, 0x08, 0x10, 0x02


def _acl(fd: int) -> list[tuple[int, int, int]] | None:
    """The (tag, perm, id) entries of the access ACL of the open ``fd``, None when it has none; a
    ValueError when the attribute is not the kernel's format."""
    try:
        try:
            data = os.getxattr(fd, _ACL)
        except OSError as e:
            if e.errno != errno.EBADF:
                raise
            data = os.getxattr(f"/proc/self/fd/{fd}", _ACL)    # an O_PATH descriptor: through its /proc link
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOENT):
            return None
        raise
    return _acl_entries(data)


def _acl_entries(data: bytes) -> list[tuple[int, int, int]]:
    """The (tag, perm, id) entries of an ACL attribute's ``data``; ValueError when not version 2."""
    if len(data) < 4 or (len(data) - 4) % _ACL_ENTRY.size or struct.unpack_from("<I", data)[0] != _ACL_VERSION:
        raise ValueError(f"an ACL of {len(data)} bytes that is not version {_ACL_VERSION}")
    return [_ACL_ENTRY.unpack_from(data, at) for at in range(4, len(data), _ACL_ENTRY.size)]


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def _acl_problem(st: os.stat_result, fd: int, q: str) -> str | None:
    """Which entry of ``fd``'s ACL lets another user or a group other than the owner's private
    group write it (under the mask), with the fix; None when none does or there is no ACL."""
    try:
        entries = _acl(fd)
    except (OSError, ValueError) as e:
        return f"has an ACL rigup cannot read ({getattr(e, 'strerror', None) or e}): setfacl -b {q}"
    if not entries:
        return None
    mask = next((perm for tag, perm, _ in entries if tag == _MASK), 0o7)

    def rwx(perm: int) -> str:
        return "".join(c if perm & mask & bit else "-" for c, bit in (("r", 4), ("w", 2), ("x", 1)))
    for tag, perm, ident in entries:
        if not perm & mask & _WRITE:
            continue
        if tag == _USER and ident not in (st.st_uid, 0):
            return (f"has an ACL letting the user {_user(ident)} (uid {ident}) write it (user:{_user(ident)}:"
                    f"{rwx(perm)}): setfacl -b {q}")
        gid = st.st_gid if tag == _GROUP_OBJ else ident
        if tag in (_GROUP, _GROUP_OBJ) and not _private_group(gid, st.st_uid):
            return (f"has an ACL letting the group {_group_name(gid)} write it (group:{_group_name(gid)}:"
                    f"{rwx(perm)}), which is not {_user(st.st_uid)}'s private group: setfacl -b {q}")
    return None


def _problem(st: os.stat_result, path: str, passage: bool = False, fd: int | None = None) -> str | None:
    """What lets another user write ``path`` (its ``st``; ``fd``, its open descriptor, whose ACL is
    read), with the fix; None when nothing does. ``passage``: a directory on the path, which may
    be sticky and writable by others."""
    me, q, mode = os.geteuid(), shlex.quote(path), stat.filemode(st.st_mode)
    if st.st_uid not in (me, 0):
        return (f"is owned by {_user(st.st_uid)} (uid {st.st_uid}), not by you ({_user(me)}) or root: "
                f"chown {_user(me)} {q}")
    if passage and st.st_mode & stat.S_ISVTX:
        return None
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by others (mode {mode}): chmod go-w {q}"
    acl = _acl_problem(st, fd, q) if fd is not None else None
    if acl:
        return acl
    if st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid, st.st_uid):
        try:
            group = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            group = f"gid {st.st_gid}"
        return (f"is writable by the group {group} (mode {mode}), which is not {_user(st.st_uid)}'s private "
                f"group: chmod g-w {q}")
    return None


def _walk(path: Path, where: str) -> tuple[int, str]:
    """An open descriptor of ``path``'s parent directory, having checked every directory from ``/``
    to it (:func:`_into`), and ``path``'s last component. Resolved here, a component at a time (the kernel's walk,
    by hand, to check each step): each directory is opened without following a link and checked
    by its descriptor; a link on the way is followed only when it is yours or root's (its directory
    was checked already: no one else could have placed it), as fs.protected_symlinks would."""
    head, name = os.path.split(os.path.join(os.getcwd(), str(path)))
    if not name or name in (".", ".."):
        raise NotOwned(where, f"{path} names no file")
    return _into(head, path, where), name


def _into(head: str, path: Path, where: str) -> int:
    """An open descriptor of the directory ``head`` (absolute), having checked every directory from
    ``/`` to it as :func:`_walk` says (``path``: the file named, for the errors)."""
    todo = [p for p in head.split("/") if p][::-1]      # a stack: the next component last
    stack = [(os.open("/", _DIR), "/")]
    links = 0
    try:
        _checked(stack[-1], path, where)
        while todo:
            part = todo.pop()
            if part in (".", ".."):
                if part == ".." and len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            fd, done = stack[-1]
            here = os.path.join(done, part)
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISLNK(st.st_mode):
                    links += 1
                    if links > 40:
                        raise NotOwned(where, f"{path}: more than 40 links on its path")
                    if st.st_uid not in (os.geteuid(), 0):
                        raise NotOwned(where, f"{path}: the link {here} on its path is owned by {_user(st.st_uid)} "
                                              f"(uid {st.st_uid}), not by you or root: name the directory it leads to")
                    target = os.readlink(part, dir_fd=fd)
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop()[0])
                    todo += [p for p in target.split("/") if p][::-1]
                    continue
                stack.append((os.open(part, _DIR, dir_fd=fd), here))
            except OSError as e:
                raise NotOwned(where, f"{path} cannot be read on the controller: {here}: {e.strerror}") from None
            _checked(stack[-1], path, where)
        return stack.pop()[0]
    finally:
        for fd, _ in stack:
            os.close(fd)


def _checked(step: tuple[int, str], path: Path, where: str) -> None:
    """:class:`NotOwned` when the directory ``step`` (its descriptor, its path) on ``path``'s way
    lets another user swap what it holds."""
    why = _problem(os.fstat(step[0]), step[1], passage=True, fd=step[0])
    if why:
        raise NotOwned(where, f"{path}: the directory {step[1]} on its path {why} (another user could swap what "
                              "it holds)")


def directory(path: str | Path, where: str, make: bool = False) -> Path:
    """``path`` (``~`` expanded), a directory that only its owner (you or root) and root can write,
    on a path of such directories; else :class:`NotOwned` naming ``where``. ``make``: made 0700
    where missing, as :func:`write` makes its directory (the path that exists checked first, each
    missing directory made by the descriptor of the checked one before it: none under another
    user's link or in their directory)."""
    path = Path(os.path.expanduser(str(path)))
    if make:
        fd, name = _made(path, where)
        try:
            os.mkdir(name, 0o700, dir_fd=fd)
        except FileExistsError:
            pass   # there already: checked below as any other
        except OSError as e:
            raise NotOwned(where, f"{path} cannot be made on the controller: {e.strerror}") from None
        finally:
            os.close(fd)
    fd, name = _walk(path, where)
    try:
        try:
            own = os.open(name, _DIR, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):    # O_PATH opens a link itself: no directory
                link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                raise NotOwned(where, f"{path} must be a directory that only you or root can write: it is "
                                      f"{'a symbolic link (name the directory itself)' if link else 'no directory'}") from None
            raise NotOwned(where, f"{path} cannot be read on the controller: {e.strerror}") from None
        try:
            why = _problem(os.fstat(own), str(path), fd=own)
        finally:
            os.close(own)
    finally:
        os.close(fd)
    if why:
        raise NotOwned(where, f"{path} must be a directory that only you or root can write: it {why}")
    return path


def opened(path: str | Path, where: str, secret: bool = False) -> int:
    """A descriptor of the file ``path`` (``~`` expanded), opened without following a link and checked
    by it: a regular file that only its owner (you or root) can write, on a path of such directories;
    ``secret``: that no one else may read either. Else :class:`NotOwned` naming ``where``
    (FileNotFoundError's message too: the callers that take a missing file as none check ``exists()``
    first). The caller closes it. A secret's file named by no path (``hf_...``: the secret given for its
    file) is refused without quoting it (issue 61, round 19 S19d)."""
    if secret and not str(path).startswith(("/", "~")):
        raise NotOwned(where, f"expected the path of the file that holds the secret, got {len(str(path))} characters "
                              "that are no path (not shown: they may be the secret itself)")
    path = Path(os.path.expanduser(str(path)))
    must = ("must be a regular file of yours that no one else may read" if secret
            else "must be a regular file that only you or root can write")
    fd, name = _walk(path, where)
    try:
        try:
            f = os.open(name, _FILE, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:     # a link, where O_NOFOLLOW opens
                raise NotOwned(where, f"{path} {must}: it is a symbolic link (name the file itself)") from None
            raise NotOwned(where, f"{path} cannot be read on the controller: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        st = os.fstat(f)
        if not stat.S_ISREG(st.st_mode):
            raise NotOwned(where, f"{path} {must}: it is no regular file ({stat.filemode(st.st_mode)})")
        why = _problem(st, str(path), fd=f)
        if not why and secret and st.st_mode & 0o077:
            why = f"may be read by others (mode {stat.filemode(st.st_mode)}): chmod 600 {shlex.quote(str(path))}"
        if why:
            raise NotOwned(where, f"{path} {must}: it {why}")
        os.set_blocking(f, True)
    except BaseException:
        os.close(f)
        raise
    return f


def read_bytes(path: str | Path, where: str, secret: bool = False, limit: int = LIMIT) -> bytes:
    """The bytes of the file ``path`` (at most ``limit``), read through :func:`opened`'s descriptor:
    what was checked is what is read."""
    f = opened(path, where, secret)
    try:
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(f, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(f)
    if size > limit:
        raise NotOwned(where, f"{os.path.expanduser(str(path))} holds more than {limit} bytes")
    return b"".join(chunks)


def read(path: str | Path, where: str, secret: bool = False, limit: int = LIMIT) -> str:
    """The text of the file ``path`` (UTF-8; :func:`read_bytes`); else :class:`NotOwned` naming ``where``."""
    try:
        return read_bytes(path, where, secret, limit).decode()
    except UnicodeDecodeError:
        raise NotOwned(where, f"{os.path.expanduser(str(path))} is not UTF-8 text") from None


def _made(path: Path, where: str) -> tuple[int, str]:
    """:func:`_walk` of ``path``, its missing directories made on the way: the deepest existing one
    checked from ``/`` (:func:`_into`) before anything is made, then each missing one made 0700 by
    the descriptor of the checked one before it (mkdirat), opened without following a link and checked."""
    head, name = os.path.split(os.path.join(os.getcwd(), str(path)))
    if not name or name in (".", ".."):
        raise NotOwned(where, f"{path} names no file")
    missing = []
    while not os.path.lexists(head):
        head, part = os.path.split(head)
        missing.append(part)
    if any(part in ("", ".", "..") for part in missing):
        raise NotOwned(where, f"{path}: a '.' or '..' below a directory that does not exist")
    fd = _into(head, path, where)
    try:
        for part in reversed(missing):
            head = os.path.join(head, part)
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass   # made meanwhile: opened and checked as any other
            below = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
            _checked((fd, head), path, where)
    except OSError as e:
        os.close(fd)
        raise NotOwned(where, f"{path}: {head} cannot be made on the controller: {e.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def write(path: str | Path, text: str, where: str, mode: int = 0o600) -> Path:
    """Write ``text`` to ``path`` (``~`` expanded) in a directory of rigup's own on the controller
    (a cache, the site directory): the directory, made 0700 when missing (the part of its path
    that exists checked first, each missing directory then made and opened relative to the checked
    one before it: nothing is made under another user's link or directory), is checked as
    :func:`directory` checks it, by the descriptor the write then goes through; the text goes to a
    new file in it (``O_CREAT|O_EXCL|O_NOFOLLOW``, ``mode``: a link or file another user planted
    under the temporary name is refused, never written through), renamed over ``path`` (a link at
    ``path`` is replaced, not followed). :class:`NotOwned` naming ``where`` when another user could
    write the directory or one on its path; OSError when the disk refuses."""
    path = Path(os.path.expanduser(str(path)))
    fd, name = _made(path, where)
    try:
        why = _problem(os.fstat(fd), str(path.parent), fd=fd)
        if why:
            raise NotOwned(where, f"{path.parent} must be a directory that only you or root can write: it {why}")
        tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        try:
            with os.fdopen(f, "w", encoding="utf-8") as out:
                out.write(text)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)
    return path


def create(path: str | Path, text: str, where: str, mode: int = 0o600) -> bool:
    """Make ``path`` (``~`` expanded) holding ``text`` once, in place (a key made on first use):
    its directory reached as :func:`read` reaches a file (a sticky one, ``/tmp``, may be writable by
    others: no one else can rename or remove what rigup made there), the missing directories made
    as :func:`write` makes them, the file made ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a file or link another
    user planted there first is never written through: :func:`read` then refuses its owner). True
    when made, False when something was there already; :class:`NotOwned` naming ``where``."""
    path = Path(os.path.expanduser(str(path)))
    fd, name = _made(path, where)
    try:
        try:
            f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        except FileExistsError:
            return False
        except OSError as e:
            raise NotOwned(where, f"{path} cannot be made on the controller: {e.strerror}") from None
        with os.fdopen(f, "w", encoding="utf-8") as out:
            out.write(text)
        return True
    finally:
        os.close(fd)


def key(text: str, where: str) -> str:
    """An API key or token (``text`` without its surrounding whitespace) when it is :data:`KEY`'s
    printable ASCII, else :class:`Unreadable` naming ``where`` and never the text."""
    found = text.strip() if isinstance(text, str) else None
    if found is None or not KEY.fullmatch(found):
        size = len(found) if found is not None else 0
        raise Unreadable(where, f"not a key ({size} characters): a key is 16 to 512 printable ASCII characters "
                                "without quotes, backslash, comma or whitespace, not beginning with '#' (rigup makes "
                                "64 hex digits)")
    return found


# a netrc's tokens in the subset that Python's netrc (pip, uv's Python side) and libcurl's (git,
# uv) read alike: by hand, since Python's reads only a path (opened again after these checks) and
# the two disagree on quotes, backslashes and '#'
_TOKEN = re.compile(r"[!$-&(-\[\]-~]{1,1024}")
_MACHINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[?[0-9A-Fa-f:.]{2,45}\]?")
_FIELDS = ("login", "password", "account")
_LINE = re.compile(r"[ -~\t\r]*")


def netrc(text: str, where: str, machines: set[str]) -> str:
    """The netrc ``text`` (``machine HOST login USER password TOKEN [account ACCOUNT]`` entries) cut
    to ``machines`` (host names, matched without case), as netrc text again, one entry a line;
    :class:`Unreadable` naming ``where`` and the line (never a token) when it is not netrc, holds a
    ``default`` entry (it would send its login to any machine) or a ``macdef``, gives a machine twice
    (curl sends the first entry's login, Python's netrc the last's), or names none of ``machines``."""
    entries: list[dict] = []
    lines = text.split("\n")
    odd = next((n for n, line in enumerate(lines, 1) if not _LINE.fullmatch(line)), None)
    if odd:
        raise Unreadable(where, f"is not a netrc file (line {odd}): a character other than printable ASCII, space or tab")
    words = [(n, w) for n, line in enumerate(lines, 1) if not line.lstrip().startswith("#") for w in line.split()]
    i = 0
    while i < len(words):
        n, word = words[i]
        if word == "default":
            raise Unreadable(where, f"a 'default' entry (line {n}) would send its login to any machine: "
                                    "name each machine instead")
        if word != "machine" or i + 1 >= len(words):
            raise Unreadable(where, f"is not a netrc file (line {n}): expected 'machine HOST'")
        host = words[i + 1][1]
        if not _MACHINE.fullmatch(host):
            raise Unreadable(where, f"is not a netrc file (line {n}): a machine is a host name or address")
        if any(e["machine"].lower() == host.lower() for e in entries):   # curl takes the first, Python's netrc the last
            raise Unreadable(where, f"is not a netrc file (line {n}): the machine {host} given twice (names match "
                                    "without case): keep one entry")
        entry, i = {"machine": host}, i + 2
        while i < len(words) and words[i][1] in _FIELDS:
            n, field = words[i]
            if i + 1 >= len(words) or field in entry or not _TOKEN.fullmatch(words[i + 1][1]):
                raise Unreadable(where, f"is not a netrc file (line {n}): {field} given twice, or without a value "
                                        "of printable characters other than quotes, backslash and '#'")
            entry[field], i = words[i + 1][1], i + 2
        if i < len(words) and words[i][1] not in ("machine", "default"):
            raise Unreadable(where, f"is not a netrc file (line {words[i][0]}): a word that is no netrc keyword, "
                                    "or a macdef, which rigup does not send")
        entries.append(entry)
    if not entries:
        raise Unreadable(where, "names no machine ('machine HOST login USER password TOKEN')")
    wanted = {m.lower() for m in machines}
    kept = [e for e in entries if e["machine"].lower() in wanted]
    if not kept:
        raise Unreadable(where, f"names no machine rigup fetches from ({', '.join(sorted(wanted)) or 'none'})")
    return "".join(" ".join(f"{k} {e[k]}" for k in ("machine", *_FIELDS) if k in e) + "\n" for e in kept)


CROSSINGS = (
    Crossing("a file named by configuration (a key file, a netrc, a site directory's YAML)",
             "its owner, and whoever can write a directory on its path",
             "rigup/boundary/owned.py:read",
             "rigup/secrets.py:controller_token, roles/vllm/command.py:netrc_text, rigup/config.py:load_yaml, "
             "roles/model_fetch/hub.py:token, roles/model_fetch/checks.py:check_endpoint"),
    Crossing("a file named by configuration that rigup uploads or only checks (llama.cpp's source archive; any "
             "[file] key's form)", "its owner, and whoever can write a directory on its path",
             "rigup/boundary/owned.py:read_bytes", "roles/llama_cpp/script.py:_archive_bytes"),
    Crossing("a file named by configuration, checked by its descriptor (a [file] key's form)",
             "its owner, and whoever can write a directory on its path",
             "rigup/boundary/owned.py:opened", "rigup/config.py:file_problem"),
    Crossing("a directory named by configuration (the artifact cache, the site directory)",
             "its owner, and whoever can write a directory on its path",
             "rigup/boundary/owned.py:directory", "roles/llama_cpp/artifact.py:cache_dir, rigup/config.py:site_dir"),
    Crossing("a file rigup keeps in a directory of its own on the controller (the hub's answers, the burn-in "
             "copies, the artifact cache's records, the tuner's host_vars and tables)",
             "rigup on the controller, and whoever can write a directory on its path",
             "rigup/boundary/owned.py:write",
             "roles/model_fetch/hub.py:_once, roles/burnin/__init__.py:kept, roles/llama_cpp/artifact.py:kept, "
             "plays/tuning.py:write_host_vars, plays/tuning.py:record, plays/bench.py:write_reports"),
    Crossing("an API key or token in a file on the controller (fleet_api_key_src, model_fetch_share_token_src, "
             "model_fetch_hf_token_src)",
             "the operator", "rigup/boundary/owned.py:key", "rigup/secrets.py:controller_token, roles/model_fetch/hub.py:token"),
    Crossing("a netrc on the controller (vllm_netrc_src)", "the operator", "rigup/boundary/owned.py:netrc",
             "roles/vllm/command.py:netrc_text"),
    Crossing("a key file made on first use at a path named by configuration (fleet_api_key_src, whose "
             "directory may be a sticky one such as /tmp)", "rigup on the controller, and whoever can write a "
             "directory on its path", "rigup/boundary/owned.py:create", "rigup/secrets.py:controller_token"),
)
