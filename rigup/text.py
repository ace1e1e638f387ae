"""Text from outside (a host, a hub, a file a host wrote) made safe for the operator's terminal.

No library of the chosen set does this for a single string (rich and click style text, they do not
neutralise it), so: every character that is not printable (C0 and C1 controls, ESC and so every
escape sequence, DEL, line and paragraph separators, bidirectional overrides) is shown as its
Python escape, and the text is cut to ``limit`` characters with a mark of how much was left out.

pyinfra prints its log records (an OperationError's text, a no-op's line, a host's warning) as they
are, inside its own colours: :class:`TerminalFilter`, on pyinfra's log handlers from the start of a
run (:func:`guard_terminal`), escapes each record the same way but for lines, tabs and colours.
What pyinfra echoes beside its log (a command's output at ``-vv``/``-vvv``: pyinfra.api.output.echo,
which pyinfra_cli sets to click.echo) is escaped so too, and the colours kept are only those click.style
wrote in the run (:func:`guard_output`).
"""

from __future__ import annotations

import itertools
import logging
import re
from urllib.parse import unquote


def _visible(c: str) -> str:
    """One character as the terminal gets it: itself when printable, else its escape (``\\x1b``)."""
    return c if c.isprintable() else c.encode("unicode_escape").decode("ascii")


# A URL's secrets (issue 61, rounds 12-13 SEC3, SEC5-SEC8): its userinfo (scheme://USERINFO@host, up to
# the authority's last '@': a login may hold one; //USERINFO@host without a scheme; the scp form
# user:PASSWORD@host:path): a password in it, or a bare login of any scheme but ssh's and file's (a token
# given as the user, as GitHub's and the hub's are; ssh://git@host's user is a login; a file URL carries
# none: git+file:///repo@v1 is pip's ref), glued to what precedes it too (pip's -ihttps://..., key:https://...:
# round 14 SEC9, SEC10), after any number of slashes or backslashes (https:/u:T@h, https:///u:T@h: round 15
# S15d; https:\\u:T@h, https:\/u:T@h: round 16 S16c, WHATWG's parsers read '\' as '/'; Python's does not, but
# the token would stand in argv and logs), where a word starts or an option glued to it (-ihttps:/...), never
# inside a URL (host.corp:/x@y is a host and a path); and a parameter named for a secret after ?, &, # or ;
# (?access_token=, #access_token=, ;token=, &X-Amz-Signature=). A password may hold an unencoded '/', '?' or '#'
# (base64 tokens hold '/': round 14 SEC11), which ends the authority as a URL parser reads it, so whether X in
# A:X... is a port or a password is told by A (round 15 S15a): A is a HOST when it holds a '.' (gitlab.corp,
# 10.0.0.1, me@corp.com) or is localhost ([::1] is never read as a login), and then digits up to /?# or the end
# are its port (gitlab.corp:8443/o/r@v1 is pip's git ref); any other A (a bare word: u, user, oauth2) is a LOGIN
# and X its password, digits or not (u:1234/TOKEN@h; a host of one word, with a port and an '@' after it, is
# written with its domain). But a login may hold a '.' too (john.doe:1234/TOKEN@pypi.corp: round 16 S16a): after
# HOST:DIGITS and a '/', '?' or '#', an '@' before a part that is host-like (_AT_HOST: localhost, an IPv4 or
# IPv6 address, or a dotted name whose last part starts with a letter: pypi.corp, bücher.de) ends a userinfo;
# one before anything else is a ref (gitlab.corp:8443/o/r@v1, @v1.2, @main stay). The price: a git ref whose
# last dotted part starts with a letter (@v2.x, @feature.fix) after a HOST:PORT URL is read as a host, the URL
# as credentials, and refused. The userinfo runs to the last '@' before the next whitespace (a password may hold
# '@' too: u:pw@h/p@ref shows as u:***@ref), the password all after the login's first ':'; within an authority
# as a URL parser reads it (up to the first '/', '?' or '#'), a space, \v or \f does not end it (urlsplit keeps
# them: https://u:correct horse TOKEN@pypi.corp has the password 'correct horse TOKEN': round 16 S16b), so there
# it runs to the authority's last '@' (but a HOST:DIGITS before the blank is a port and prose after it; prose
# after a login's password or a bare word, with no '/' before an '@' on the same line, is hidden with it). A bare login holding '/' is left: //TOKEN/x@ref cannot be told from //host/o/r@ref.
_PART = r"[^\s/?#:\[\]]*"   # what stands before the authority's first ':'
_HOST = rf"(?:{_PART}\.{_PART}|(?i:localhost))"
_LABEL = r"[^\s/\\?#:@.\[\]]+"
_AT_HOST = (rf"(?:(?i:localhost)|\[|[0-9]{{1,3}}(?:\.[0-9]{{1,3}}){{3}}|(?:{_LABEL}\.)+(?![0-9-]){_LABEL})"
            r"(?=[:/\\?#]|\s|$)")
# (a scheme starts where a run of its characters does: tried inside a long run, each start read the run to its end,
# and redacted took 16 s for 40k letters: round 19 R19a)
_LEAD = (r"((?:(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*):)?(?<!/)//(?!/)"   # scheme://, //: glued to anything
         r"|(?:(?<![\w+./@%~-])|(?<=(?<!\S)-))([A-Za-z][A-Za-z0-9+.-]*):[/\\]+)")   # scheme:/, :///, :\\
_USERINFO = re.compile(_LEAD + rf"((?:{_HOST}:(?![0-9]*(?:[/?#]|\s|$))|(?!{_HOST}:){_PART}:)\S*"
                               rf"|{_HOST}:[0-9]*[/?#]\S*(?=@{_AT_HOST})|[^\s/?#]*)@", re.ASCII)
# a URL's authority as its parser reads it (up to its first '/', '?' or '#'), blanks included
_AUTHORITY = re.compile(_LEAD + r"([^/?#\t\r\n]*)", re.ASCII)
_BLANKS = re.compile(r"[ \x0b\x0c]")
_PORT = re.compile(rf"{_HOST}:[0-9]*[ \x0b\x0c]", re.ASCII)   # HOST:PORT, then prose (https://10.0.0.1:8000 is down)
_SCP = re.compile(r"(?<![A-Za-z0-9+./:@-])([A-Za-z0-9._-]+):([^\s@/:]+)@(?=[A-Za-z0-9.-]+:)", re.ASCII)
# A parameter is named for a secret by its name percent-decoded, as the server reads it (?%74oken=: round 15
# S15f): any name up to its '=' (?auth[token]=, ?x:token=: round 16 S16d) holding a word below, or jwt, bearer or
# session(id) as a word of its own (?jwt=, ?bearer=, ?session_id=; round 16 S16d), or named pass or pw (db_pass=,
# user-pw=), or code (OAuth's authorization code, a secret for as long as it lives; country_code=, encode= are
# no secret)
_QUERY = re.compile(r"([?&#;][^=&;#?\s]*=)[^&;\s#]*", re.ASCII)   # (no "?" in a name: "?" * n read each from each)
_SECRET_NAME = re.compile(r"token|key|secret|passw|passcode|pwd|sig|auth|credential|hmac|saml|verifier|cookie|"
                          r"(?<![a-z])(?:jwt|bearer|session(?:id)?|otp|ticket)"
                          r"(?![a-z])|(?:^|[^a-z0-9])(?:pass|pw)$|^code$", re.I)
# The words that name a secret, one list (issue 61, rounds 12-18): a variable's name (rigup.instances.vllm
# secret_variable), a NAME=VALUE, "NAME": "VALUE" or --NAME VALUE inside a value (redacted) is one when a word of
# its name (split at anything not a letter or digit and where camelCase turns), numbered or plural (PASSWORD2,
# APIKEYV2, SECRETS), is below or ends in one of SECRET_ENDS glued (PGPASSWORD, X_PRIVATEKEY). A query
# parameter's name is read wider (_SECRET_NAME, a word inside another: hiding its value costs nothing; a
# variable or a flag refused for MONKEY or --tokenizer would).
SECRET_WORDS = frozenset({
    "token", "key", "keys", "apikey", "secret", "password", "passwd", "pass", "passphrase", "passcode", "pat", "pw",
    "pwd", "bearer", "credential", "credentials", "auth", "authz", "authorization", "header", "headers", "cookie",
    "cookies", "jwt", "hmac", "sig", "signature", "otp", "ticket", "session", "sessionid", "sessid", "phpsessid",
    "jsessionid", "creds", "privkey", "psk"})
SECRET_ENDS = ("token", "password", "passwd", "secret", "apikey", "accesskey", "secretkey",
               "privatekey", "signingkey", "masterkey", "encryptionkey", "sessionid", "sessid", "signature", "hmac",
               "passcode", "passphrase", "privkey")
# a plural of these is still one; not TOKENS, a count (VLLM_MAX_TOKENS, --max-num-batched-tokens)
_PLURALS = ("secret", "password", "passwd", "passphrase", "apikey", "accesskey", "secretkey", "privatekey",
            "signature", "credential", "cookie", "accesstoken", "refreshtoken", "idtoken")
_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NUMBERED = re.compile(r"v?[0-9]+$")
# inside a value: NAME=VALUE where a name may stand (Password=S;Server=db, host=db password=S, --api-key=S),
# "NAME": "VALUE" (JSON), --NAME VALUE (one value holding both: '--api-key S'), an Authorization header's
# credentials and a Bearer or Basic token written out (round 18 S18b)
_ASSIGNED = re.compile(r"(?<![\w.-])(-{0,2}[A-Za-z_][\w.-]*)(\s*(?:=>?|:(?!//))\s*)(?=[^\s,;\])}])", re.ASCII)
# read only after a secret's name (x=ax=ax=a... stays linear); a quoted value inside its quotes (round 20 S20a)
_ASSIGNED_VALUE = re.compile(r'"((?:[^"\\\n]|\\.)*\\?)(?:"|$)|\'((?:[^\'\\\n]|\'\'|\\.)*\\?)(?:\'|$)|([^\s,;&\'"\])}]+)',
                             re.M)   # (a lone backslash before the line's end is the value's: round 25 S25b, HF_TOKEN="S\)
# NAME: VALUE unquoted, as YAML reads a plain value: to the end of its line, or a " #" comment (round 22 S22c:
# "password: correct horse" hid "correct" alone); found by str.find, not a pattern (one with a lookahead over
# blanks took 5 s for 16k spaces)
_COMMENT = re.compile(r"[ \t]#")
_DIGITS = re.compile(r"[0-9]+")
# the rest of a quoted value not closed on its line, to its closing quote (\" in double quotes, '' in single) or the end
# (a lone backslash at the end reads as the end: round 27 S27a, my round 26 pattern matched nothing there and raised)
_CLOSE = {'"': re.compile(r'(?:[^"\\]|\\[\s\S])*\\?("|\Z)'), "'": re.compile(r"(?:[^']|'')*('(?!')|\Z)")}
_HOST_PORT = re.compile(r"[0-9]*(?:[/?#\s]|$)")
# a plain value that is no secret: YAML's booleans and null, one digit (use_auth_token: true, hf_token: null,
# HF_HUB_DISABLE_TOKEN: 1: round 23 F23)
# (then the end, or prose: "true, or host: ...", "true (a key made ...)"; not "1;S" or "no,S": round 26 S26a)
# (round 27 S27b: "7, S" was let through: only rigup's own shapes, "true, or host: ...", "true (a key ...)", "true)")
_VALUE_END = r"(?=[ \t\r]*(?:\n|\Z|[ \t]#))"   # (a plain value's end: its line's, or a comment's)
_NO_SECRET = re.compile(rf"(?i:true|false|yes|no|on|off|null|none|~|[0-9])(?:{_VALUE_END}|(?=, or |\){_VALUE_END}))"
                        r"|(?i:true|false)(?= \()")
_HIDDEN_ALREADY = re.compile(rf"\*\*\*(?:{_VALUE_END}|@)")   # (***@: a URL's userinfo hidden; judged here, at the
# value's start, not after its line is read: round 31 Q31a, a line of them took the square)
# a model's special token's text (<image>, <|AUDIO|>, </s>) as the value of a name ending in token: no secret
# (round 22 F22: vLLM's --hf-overrides '{"image_token": "<image>"}' was refused)
_SPECIAL_TOKEN = re.compile(r"</?\|?[A-Za-z0-9_.:|/ -]{1,40}\|?>")
_JSON_KEY = re.compile(r"""(["'])([^"'\\]{1,64})\1(\s*:\s*)(["'])((?:(?!\4)[^\\]|\\.)*)\4""")
# "NAME": [ ... ] a list of no list or map under a secret's key (round 24 J24b: {"password": ["S"]})
_JSON_LIST = re.compile(r"""(["'])([^"'\\]{1,64})\1(\s*:\s*\[)([^\[\]{}]+)(?=\])""")
_FLAG_VALUE = re.compile(r"(?<![\w.-])(['\"]?--?[A-Za-z][\w-]*['\"]?)([ \t]*\\\r?\n[ \t]*|[ \t]+)(?!['\"]?-)"
                         r"(\"[^\"\n]{0,256}\"|'[^'\n]{0,256}'|\S+)", re.ASCII)
# ("--api-key" "S" in a unit's ExecStart: round 26 S26e; \ newline: S24d; after '=' or ':', VLLM_ARGS=--api-key S:
# round 28 S28a; a quoted value holding a blank, --api-key "correct horse": S28c, bounded so that an unclosed quote
# repeated costs no square)
# a flag and its value as two items of a list: ['--api-key', 'S'] (Python's repr of an argv), ["--api-key", "S"],
# YAML's "- --api-key" then "- S" (round 23 S23d)
# (quoted alike, or YAML's items: round 24 G24a, rigup's own "gives --api-key, which rigup sets" was cut; S24c an
# argv printed one item a line)
# (round 25 S25c: YAML's flow list [--api-key, S] and quoted items; S25d: a value in its own quotes, ["--x", "it's"])
# (round 26: S26c a flow list over lines, a quoted value in one; S26d a value holding a backslash or an escaped quote)
_FLAG_ITEMS = re.compile(r"""(?<![\w-])(['"])(--?[A-Za-z][\w-]*)\1([ \t]*,\s*(['"]))(?!-)((?:(?!\4)[^\n\\]|\\.)+)(?=\4)"""
                         r"""|(?<!\S)(-[ \t]+['"]?)(--?[A-Za-z][\w-]*)(['"]?[ \t]*\r?\n(?:[ \t]*\r?\n)*[ \t]*-[ \t]+['"]?)(?!-)([^\s'"]+)"""
                         r"""|(?<=[\[,])(\s*)(--?[A-Za-z][\w-]*)(\s*,\s*['"]?)(?!-)([^\s,\]'"]+)""", re.ASCII)
# curl's -u/--user and --proxy-user USER:PASSWORD (round 23 S23d: a host's ps line)
_USER_FLAG = re.compile(r"(?<!\S)(-u|--user|--proxy-user|-U)([ \t]+|=|(?<=-[uU])(?=[A-Za-z0-9_]))([^\s:]*):(\S+)", re.ASCII)
# a private key written out, to its end or the next one's start (round 24 S24g: no name before it)
_PRIVATE_KEY = re.compile(r"(-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)(?:(?!-----BEGIN )[\s\S])*?"
                          r"(-----END [A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|(?=-----BEGIN )|$(?![\s\S]))")
_HEADER = re.compile(r"(?i)((?:proxy-)?authorization\s*[:=]\s*(?:(?:bearer|basic|digest|token|negotiate)\s+)?)(\S+)")
# (a token holds a digit, a sign or both cases: "basic configuration", "a bearer of news" are prose)
_TOKEN = re.compile(r"(?<![\w-])((?i:bearer)\s+)((?=[\w.~+/=-]*(?:[0-9._~+/=-]|[a-z][A-Z]|[A-Z][a-z]))[\w.~+/=-]{4,})"
                    r"|(?<![\w-])((?i:basic)\s+)"
                    r"((?=[A-Za-z0-9+/]*(?:[0-9+/=]|[a-z][A-Z]|[A-Z][a-z]))[A-Za-z0-9+/]{8,}={0,2})(?![\w/+=])")
# A name inside a value (a setting, a JSON key, a flag) names a secret by its last word or two (round 19: the
# model's own tokens, bos_token, add_bos_token, eos_token_id, and a JSON "key" are no secret; a flag's
# credentials, --allow-credentials, a feature): a word below, or a pair of _VALUE_PAIRS, or the whole name
# "token"; a name ending in file, path or dir names where a secret is, not the secret (--ssl-key-file).
_VALUE_WORDS = frozenset({"password", "passwd", "pwd", "pw", "pass", "passphrase", "passcode", "secret", "apikey",
                          "creds", "privkey", "psk",
                          "jwt", "hmac", "signature", "sessionid", "sessid", "phpsessid", "jsessionid", "otp", "bearer",
                          "cookie", "accesstoken", "apitoken", "authtoken", "refreshtoken", "idtoken", "hftoken",
                          "secretkey", "privatekey", "accesskey", "clientsecret"})
_VALUE_PAIRS = frozenset({("api", "key"), ("access", "token"), ("auth", "token"), ("refresh", "token"),
                          ("id", "token"), ("bearer", "token"), ("hf", "token"), ("api", "token"), ("secret", "key"),
                          ("private", "key"), ("access", "key"), ("session", "token"), ("security", "token"),
                          ("client", "secret"), ("session", "id"), ("signing", "key"), ("master", "key"),
                          ("encryption", "key")})
_PATHS = ("file", "files", "path", "dir")
# the words rigup's own sentences put after "KEY: " (api_key: expected bool): no secret's value (round 21 S21a: any
# lower-case word was one, and "password: letmein" was shown)
# (round 22 S22c: no article, "password: the S"; a secret after one of these words is the price of rigup's messages)
_PROSE = frozenset({"expected", "got", "remove", "holds", "give", "not", "must", "unknown", "missing", "refused", "only",
                    "needs", "carries", "drop", "set"})
# a token's word before which a token is the model's, not a secret (bos_token, add_bos_token, max_token)
_MODEL_TOKENS = frozenset({"bos", "eos", "pad", "unk", "sep", "cls", "mask", "eot", "eom", "fim", "max", "num"})


def secret_name(name: str) -> bool:
    """Whether ``name`` (a variable's, a parameter's, a flag's, a JSON key) names a secret by the words above."""
    for word in _WORD.findall(_CAMEL.sub("_", str(name))):
        word = _NUMBERED.sub("", word.lower())
        forms = {word, word[:-1]} if word.endswith("s") and word[:-1].endswith(_PLURALS) else {word}
        if any(f in SECRET_WORDS or f.endswith(SECRET_ENDS) and f != "tiktoken" for f in forms):   # (a library)
            return True
    return False


def query_secret_name(name: str) -> bool:
    """Whether a query parameter ``name`` (percent-decoded) names a secret: the wider reading (_SECRET_NAME; TIKTOKEN,
    OpenAI's tokenizer library, is no token: TIKTOKEN_ENCODINGS_BASE, vLLM's offline gpt-oss encodings)."""
    # (only as the name's first word: round 22, access_tiktoken was read as access_)
    return bool(_SECRET_NAME.search(re.sub(r"^tiktoken(?![a-z0-9])", "", name, flags=re.I))) or secret_name(name)


_PLAIN_LOGIN = ("ssh", "git+ssh", "ssh+git", "sftp", "file", "git+file")   # a bare login there is no token
# A URL parser drops an ASCII tab, CR or LF wherever it stands (WHATWG; Python's urlsplit, so pip: round 15
# S15h): https://u:ab<TAB>TOKEN@h is u:abTOKEN to pip. redacted() reads such a URL (from its scheme:/ or //
# up to the next other whitespace) with them dropped; carries_credentials() refuses any text holding one.
# A no-break space is part of the password pip sends, as a space, \v and \f are (_AUTHORITY).
_DROPPED = str.maketrans("", "", "\t\r\n")
# A run of over 2048 characters without a blank is no URL or setting an operator reads, and the readers below
# would take time growing with its square (round 20 R20a: 40k characters of '?' or '//a:' took 5 s, 200k minutes):
# redacted shows its length instead, and carries_credentials refuses it (rigup.models.credential_problems says so).
LONG_RUN = 2048
_LONG_RUN = re.compile(rf"(?<![^ \t\n\r\x0b\x0c])[^ \t\n\r\x0b\x0c]{{{LONG_RUN + 1},}}")   # (ASCII blanks: the readers')


def long_run(text: str) -> bool:
    """Whether ``text`` holds a run of over :data:`LONG_RUN` characters without an ASCII blank."""
    return _LONG_RUN.search(text) is not None
_SPAN = re.compile(r"(?:(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*:[/\\]|//)\S*[\t\r\n][\S\t\r\n]*", re.ASCII)


def redacted(text: str) -> str:
    """``text`` with each URL's secrets as ``***`` (``https://u:TOKEN@h`` -> ``https://u:***@h``,
    ``https://TOKEN@h`` -> ``https://***@h``, ``?access_token=T`` -> ``?access_token=***``): every line for
    the operator goes through it (:func:`say`), so a refusal quoting a URL never prints its credentials;
    the keys that would hand them to a program (git, pip) are refused besides."""

    text = _LONG_RUN.sub(lambda m: f"[{len(m.group(0))} characters without a blank, not shown]", text)

    def joined(m: re.Match) -> str:   # as the URL parser reads it, when that hides something
        url = m.group(0).translate(_DROPPED)
        if len(url) > LONG_RUN:   # joined, a run the readers would take the square of its length on (round 21 R21a)
            return f"[{len(m.group(0))} characters without a blank, not shown]"
        return hidden if (hidden := _hidden(url)) != url else m.group(0)
    return _hidden(_SPAN.sub(joined, text) if text != text.translate(_DROPPED) else text)


def carries_credentials(text: object) -> bool:
    """Whether ``text``, handed to a program (git, pip, a server as a flag's value or a variable), would
    carry credentials: :func:`redacted` hides some of it, or it holds a tab, CR or LF, which a URL parser
    drops (the URL the program reads is not the one shown). One rule for every key refused so: vllm_git_url,
    vllm_pip_args, vllm_install_env, vllm_ray_args, llama_cpp_source, and every value of a serving instance
    (extra_args, env) and of vllm_env (rigup.models.credential_problems)."""
    text = str(text)
    return redacted(text) != text or text != text.translate(_DROPPED)


def _hidden(text: str) -> str:
    """:func:`redacted` of ``text`` read as it stands."""
    def hidden(lead: str, scheme: str, info: str) -> str | None:
        user, colon, _ = info.partition(":") if ":" in info else (info, "", "")
        if colon:
            return f"{lead}{user}:***@"
        return f"{lead}***@" if info and scheme.lower() not in _PLAIN_LOGIN else None

    def one(m: re.Match) -> str:
        return hidden(m.group(1), m.group(2) or m.group(3) or "", m.group(4)) or m.group(0)

    def blanks(m: re.Match) -> str:   # a URL's userinfo holding a space, \v or \f: to the authority's last '@'
        scheme, (info, at, host) = m.group(2) or m.group(3), m.group(4).rpartition("@")
        found = hidden(m.group(1), scheme, info) if scheme and at and _BLANKS.search(info) \
            and not _PORT.match(info) else None
        return found + host if found else m.group(0)
    if "@" in text:   # (each reads a userinfo up to an '@': without one, a long text costs them nothing)
        text = _AUTHORITY.sub(blanks, text)
        text = _USERINFO.sub(one, text)
        text = _SCP.sub(lambda m: f"{m.group(1)}:***@", text)
    text = _QUERY.sub(lambda m: f"{m.group(1)}***" if query_secret_name(unquote(m.group(1)[1:-1]))
                      and m.group(0)[len(m.group(1)):].strip(",.") else m.group(0), text)   # (?token=, or: prose)
    text = _HEADER.sub(lambda m: f"{m.group(1)}***", text)
    text = _PRIVATE_KEY.sub(lambda m: f"{m.group(1)}***{m.group(2)}", text) if "PRIVATE KEY" in text else text
    text = _TOKEN.sub(lambda m: f"{m.group(1)}***" if m.group(1) else f"{m.group(3)}***", text)
    text = _assigned(text)
    text = _JSON_KEY.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{m.group(4)}***{m.group(4)}"
                         if m.group(5) and m.group(5) != "***" and named_secret(m.group(2))
                         and not special_token(m.group(2), m.group(5)) else m.group(0), text)
    text = _USER_FLAG.sub(lambda m: m.group(0) if _DIGITS.fullmatch(m.group(3) + m.group(4))   # (-u 1000:1000: uid:gid)
                          else f"{m.group(1)}{m.group(2)}{m.group(3)}:***", text)
    text = _FLAG_ITEMS.sub(_flag_item, text)
    text = _JSON_LIST.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}***"
                          if named_secret(m.group(2)) and m.group(4).strip() not in ("", "***") else m.group(0), text)
    return _FLAG_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}***" if named_secret(m.group(1)) and m.group(3).strip("\"'") != "***"
                           else m.group(0), text)


def _assigned(text: str) -> str:
    """``text`` with the value of each NAME=VALUE, NAME: VALUE or NAME => VALUE whose name is a secret's as ``***``
    (a name not one is passed over, its value read again as a name: db:password=S). A host's NAME:PORT in a URL
    (after '//' or '@') is no assignment; NAME: then a value unquoted is hidden to its line's end, as YAML reads it."""
    # (the bounds of the line last read, and where its deeper lines end: found once a line, rounds 24-30 R24a, R25a,
    # Q29a, Q30a: each read again per value took the square of a line of values)
    out, last, line, deeper = [], 0, (0, -1), 0
    for m in _ASSIGNED.finditer(text):
        name, sep = m.groups()
        # (a bare "token" glued to its sign only: "EOS token = 2" is llama.cpp's log of the model's tokens)
        if m.start() < last or not named_secret(name) or name == "token" and sep[:1].isspace():
            continue
        colon = ":" in sep
        # a URL's HOST:PORT (https://a.pw:8080/, u@db.token:5432): inside an authority, the colon glued, then digits
        # to a '/', a blank or the end, or a '/' (round 23 S23c: any NAME: after '/' or '@' was let through)
        if sep == ":" and (text.endswith("//", 0, m.start()) or text.endswith("@", 0, m.start())) \
                and _HOST_PORT.match(text, m.end()):
            continue
        value = _ASSIGNED_VALUE.match(text, m.end())
        if colon and sep[-1:].isspace() and (value is None or value.lastindex == 3):
            # (KEY: then one of rigup's own words is its sentence, "api_key: expected bool", not a secret: _PROSE)
            if value and value.group(3) in _PROSE:
                continue
            # (judged at its start, before its line is read: a line of values let through, "password: 7, or ..."
            # repeated, read each to the line's end, round 28 Q28b)
            if _NO_SECRET.match(text, m.end()) or _HIDDEN_ALREADY.match(text, m.end()):
                continue
            if m.end() > line[1]:
                line = (text.rfind("\n", 0, m.start()) + 1, _line_end(text, m.end()))
                deeper = _deeper_lines(text, line)
            at, end = m.end(), line[1]
            comment = _COMMENT.search(text, at, end)
            end = comment.start() if comment else end
            while end > at and text[end - 1] in " \t\r":
                end -= 1
            # (a special token alone on its line; folded over deeper lines it is a value's first word: round 30 S30a)
            if deeper == line[1] and end - at <= 48 and special_token(name, text[at:end]):
                continue
            end = deeper if deeper > line[1] else end
            value = True   # (a YAML anchor or tag first: password: &pw S, round 24 S24b)
        elif value:
            at, end = value.start(value.lastindex), value.end(value.lastindex)
            if value.lastindex < 3 and (len(value.group(0)) < 2 or value.group(0)[-1] != value.group(0)[0]):
                # a quote not closed on its line: to its closing quote, or the text's end (rounds 24-25 S24a, S25a)
                close = _CLOSE[value.group(0)[0]].match(text, value.end())   # (its escapes honoured: round 26 S26b)
                end = close.end() - len(close.group(1)) if close else len(text)
        inner = text[at:end] if value else ""
        if not inner or inner == "***" or inner.startswith("***@") or special_token(name, inner):   # (***@: a URL's, hidden)
            continue
        out += [text[last:at], "***"]
        last = end
    return "".join(out) + text[last:]


def _flag_item(m: re.Match) -> str:
    """A :data:`_FLAG_ITEMS` match with the value of a flag naming a secret as ``***``."""
    lead, flag, gap, value = m.group(1, 2, 3, 5) if m.group(2) else m.group(6, 7, 8, 9) if m.group(7) \
        else m.group(10, 11, 12, 13)
    if not named_secret(flag) or value == "***":
        return m.group(0)
    return f"{lead}{flag}{lead}{gap}***" if m.group(2) else f"{lead}{flag}{gap}***"


def _line_end(text: str, at: int) -> int:
    """Where the line holding ``at`` ends (its newline, or the text's end)."""
    end = text.find("\n", at)
    return len(text) if end < 0 else end


def _deeper_lines(text: str, line: tuple[int, int]) -> int:
    """Where the lines after ``line`` (its start and end) indented deeper than it end, or ``line``'s end without
    any (a YAML value folded or in a block, ``password: |`` then its lines: round 23 S23a), over the blank lines
    between them (round 24 S24a); any blank counts as indentation."""
    indent = len(text[line[0]:line[1]]) - len(text[line[0]:line[1]].lstrip())
    at = end = line[1]
    while at < len(text):
        line_end = _line_end(text, at + 1)
        following = text[at + 1:line_end]
        if following.strip() and len(following) - len(following.lstrip()) <= indent:
            break
        if following.strip():
            end = line_end
        at = line_end
    return end


def no_secret_value(text: str) -> bool:
    """Whether ``text`` is no secret's value whatever its name: a YAML boolean or null, or one digit (a switch)."""
    return _NO_SECRET.fullmatch(text.strip()) is not None


def special_token(name: str, value: str) -> bool:
    """Whether ``value`` is a model's special token given to a name ending in token, none of a credential's
    (image_token: <image>; not access_token, hf_token, a bare token)."""
    words = [w.lower() for w in _WORD.findall(_CAMEL.sub("_", name))]
    return _SPECIAL_TOKEN.fullmatch(value) is not None and len(words) > 1 and words[-1] == "token" \
        and tuple(words[-2:]) not in _VALUE_PAIRS and words[-2] not in _VALUE_WORDS


def named_secret(name: str) -> bool:
    """A name inside a value (Password, db_pass, --api-key, "api_key") naming a secret: by its last word or two."""
    words = [_NUMBERED.sub("", w.lower()) for w in _WORD.findall(_CAMEL.sub("_", name))]
    if not words or words[-1] in _PATHS:
        return False
    last = words[-1][:-1] if words[-1].endswith("s") and words[-1][:-1] in _VALUE_WORDS else words[-1]
    if last == "token" and len(words) > 1:   # GITHUB_TOKEN, NPM_TOKEN, hub_token (round 20 S20a); not bos_token
        return words[-2] not in _MODEL_TOKENS
    pair = (*words[-2:-1], words[-1][:-1] if words[-1].endswith("s") else words[-1])   # (api_keys: round 24 J24b)
    return last in _VALUE_WORDS or tuple(words[-2:]) in _VALUE_PAIRS or pair in _VALUE_PAIRS or words == ["token"]


def shown(text: object, limit: int = 200) -> str:
    """``text`` as it may reach a terminal: one line, escapes visible, at most ``limit`` characters
    (escapes counted as shown: ``\\x1b`` is 4), then how many characters of ``text`` were left out."""
    raw = str(text)
    pieces = [_visible(c) for c in raw[:limit]]
    kept = len(list(itertools.takewhile(limit.__ge__, itertools.accumulate(map(len, pieces)))))
    return "".join(pieces[:kept]) + (f"... ({len(raw) - kept} more characters)" if kept < len(raw) else "")


def shown_lines(text: str, limit: int = 300, last: int | None = 60) -> str:
    """A host's multi-line text (a journal, a table) as :func:`shown` lines: its ``last`` lines (all
    with None), each escaped and cut to ``limit`` (a final newline kept). Lines end at ``\\n`` (or
    ``\\r\\n``) only: the other separators str.splitlines knows (``\\x1c``, ``\\x85``, ``\\u2028``) are
    escaped in their line, so each line shown is a line of ``text``."""
    text = str(text)
    lines = text.replace("\r\n", "\n").split("\n")[:-1 if text.endswith("\n") else None]
    out = "\n".join(shown(line, limit) for line in (lines[-last:] if last is not None else lines))
    return out + "\n" if text.endswith("\n") and out else out


def say(line: str, fg: str | None = None) -> None:
    """One line for the operator (stderr, as pyinfra's own), ``fg`` its colour: built by rigup
    around what hosts said, so escaped whole (:func:`shown`, up to 4000 characters)."""
    import click   # here: the GPU scripts import this module with a plain python3

    # (its first 8000 characters read, of which 4000 are shown: a host's line of megabytes is read in linear time,
    # yet seconds of it; round 22 R22a)
    text = shown(redacted(line[:8000]), 4000) + (f" (a line of {len(line)} characters)" if len(line) > 8000 else "")
    click.echo(click.style(text, fg=fg) if fg else text, err=True)


# The colour sequences kept are those click.style wrote in this run (pyinfra's format_text and
# pyinfra_cli's click.style, through :func:`styled` once :func:`guard_output` has run): each text it
# returned, whole, is remembered (the newest _KEPT), and terminal_text keeps the sequences of such a
# text only. A host's text reaches a line either inside one (styled escapes it first) or beside it
# (escaped there, its colour sequences too: no black on black, no conceal); at most it can repeat a
# styled text pyinfra wrote itself. A lone reset is kept anywhere: it only restores the defaults.
_STYLED: dict[str, None] = {}
_KEPT = 4096
_RESET = "\x1b[0m"
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def _escaped(text: str) -> str:
    return "".join(c if c in "\n\t" else _visible(c) for c in text)


def _kept(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` that :func:`styled` returned (longest first at each colour sequence),
    and each lone reset."""
    ends = [m.end() for m in re.finditer(re.escape(_RESET), text)]
    spans: list[tuple[int, int]] = []
    for match in _SGR.finditer(text):
        at = match.start()
        if spans and at < spans[-1][1]:
            continue
        end = next((j for j in reversed(ends) if j > at and text[at:j] in _STYLED), None)
        if end is None and match[0] == _RESET:
            end = match.end()
        if end is not None:
            spans.append((at, end))
    return spans


def terminal_text(text: str) -> str:
    """``text`` with every character :func:`shown` escapes (C0 and C1 controls, ESC and so every
    escape sequence, DEL, line and paragraph separators, bidirectional controls) escaped as it does,
    but for newlines, tabs and the colour sequences of a text :func:`styled` returned (and a lone
    reset); not cut. Text without such a character comes back as it is."""
    if text.isprintable():
        return text
    out, at = [], 0
    for start, end in _kept(text):
        out += [_escaped(text[at:start]), text[start:end]]
        at = end
    return "".join(out) + _escaped(text[at:])


def styled(text: object, *args, **kwargs) -> str:
    """click.style of :func:`terminal_text` of ``text`` (a host's line pyinfra colours, escaped),
    remembered so that :func:`terminal_text` keeps its colours."""
    out = _click_style(terminal_text(str(text)), *args, **kwargs)
    _STYLED.pop(out, None)
    _STYLED[out] = None
    if len(_STYLED) > _KEPT:
        del _STYLED[next(iter(_STYLED))]
    return out


def _click_style(text: str, *args, **kwargs) -> str:
    from click import termui   # here: the GPU scripts import this module with a plain python3

    return termui.style(text, *args, **kwargs)   # click's own, whatever click.style now is


class TerminalFilter(logging.Filter):
    """Rewrites a log record's message (and its traceback's text) to :func:`terminal_text` of it:
    put on a handler, nothing it prints holds a control character beyond pyinfra's own colours
    (:func:`styled`'s)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:   # arguments that do not fit: the handler reports it (as repr, escaped)
            return True
        text = terminal_text(message)
        if text != message:
            record.msg, record.args = text, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        for key in ("exc_text", "stack_info"):
            if getattr(record, key, None):
                setattr(record, key, terminal_text(getattr(record, key)))
        return True


def guard_terminal(name: str = "pyinfra") -> None:
    """A :class:`TerminalFilter` on each handler of the logger ``name`` (pyinfra's: pyinfra_cli
    prints every record through its LogHandler), once each: called again, it adds none twice and
    covers a handler added since."""
    for handler in logging.getLogger(name).handlers:
        if not any(isinstance(f, TerminalFilter) for f in handler.filters):
            handler.addFilter(TerminalFilter())


def _echo(message: object = None, *args, **kwargs) -> None:
    """click's own echo of :func:`terminal_text` of ``message``: pyinfra's echo, and click.echo itself
    once :func:`guard_output` has run (pyinfra_cli prints an exception's traceback, the text of a
    host or a hub among it, with click.echo: round 10 TF2)."""
    from click import utils   # click's own, whatever click.echo now is

    if isinstance(message, (bytes, bytearray)):
        message = bytes(message).decode("utf-8", "replace")
    utils.echo(message if message is None else terminal_text(message if isinstance(message, str) else str(message)),
               *args, **kwargs)


def guard_output() -> None:
    """Where pyinfra_cli has installed its output (pyinfra.api.output): its echo (what a run prints
    beside its log, as each command's output at -vv/-vvv) through :func:`terminal_text`, and its
    colours, pyinfra's format_text and pyinfra_cli's click.style, through :func:`styled` (the only
    colours terminal_text keeps); click.echo through :func:`_echo`. Once: called again, it changes nothing."""
    import click
    from pyinfra.api import output

    if output.is_output_active():
        click.style = styled
        click.echo = _echo
        output.set_formatter(styled)
        output.set_echo(_echo)
