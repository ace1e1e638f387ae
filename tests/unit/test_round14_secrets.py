"""Issue 61, round 14 SEC11 (/tmp/redteam/round14/round14.md): a URL password holding an unencoded '/', '?'
or '#' (base64 tokens hold '/') ended the userinfo rigup.text.redacted looked for, so say() printed it whole
and vllm's credentialed() let it reach pip's argv. Now after USER: and no port the userinfo runs to the last
'@' before the next whitespace; a host:port and pip's git ref after it (host:8443/o/r@v1) stay as they are."""
import re
import string

import pytest
from hypothesis import assume, given, settings, strategies as st

from rigup.text import redacted, say
from roles.vllm.checks import credentialed
from tests.unit.hosts import data

S = "SeCrEt9"


@pytest.mark.parametrize("url, shown", [
    (f"https://u:ab/{S}@h/simple", "https://u:***@h/simple"), (f"https://u:{S}?x@h/", "https://u:***@h/"),
    (f"https://u:{S}#x@h/", "https://u:***@h/"), (f"--index-url=https://u:a/{S}@h/simple", "--index-url=https://u:***@h/simple"),
    (f"-ihttps://u:{S}/+=@pypi.corp/simple", "-ihttps://u:***@pypi.corp/simple"),
    (f"git+https://u:{S}/x@github.com/o/r@v1", "git+https://u:***@v1"),            # up to the last '@'
    (f"https://u:p:{S}@h", "https://u:***@h"),                                       # a ':' in the password
    (f"https://me@corp:{S}/x@hub/y", "https://me@corp:***@hub/y"),
    (f"url:https://u:{S}/y@h/x and more", "url:https://u:***@h/x and more")])
def test_sec11_a_password_holding_slash_query_or_fragment_is_redacted_and_refused(url, shown, capsys):
    say(f"refused: got {url}")
    said = capsys.readouterr().err
    print(said.strip())
    assert redacted(url) == shown and S not in said
    assert credentialed(data(vllm_pip_args=[url])) == ["vllm_pip_args[0]"]


@pytest.mark.parametrize("plain", [
    "git+https://gitlab.corp:8443/o/r@v1.2#egg=x", "https://h.corp:8443/x@y", "https://h.corp:/x@y", "https://[::1]:8/x@y",
    "https://github.com/o/r@v1", "https://h/a:b/c@d", "https://h/x?a=b:c@d", "https://localhost:8443?x@y",
    "https://10.0.0.1:8443#x@y"])   # a host of one word with a port is read as a login: tests/unit/test_round15.py
def test_a_port_and_a_git_ref_after_it_are_no_password(plain):
    assert redacted(plain) == plain and credentialed(data(vllm_pip_args=[plain])) == []


PRINTABLE = "".join(c for c in string.printable if not c.isspace())
HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z0-9-]{1,8}){1,2}", fullmatch=True)   # a '.': no login (round 15)
TAIL = st.text(alphabet=PRINTABLE.replace("=", "").replace(":", ""), max_size=20)   # no secret parameter, no scp form


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(["https", "http", "git+https", "HTTPS", "s3", "ftp"]),
       user=st.from_regex(r"[A-Za-z0-9_~-]{1,12}", fullmatch=True).filter(lambda u: u.lower() != "localhost"),
       password=st.text(alphabet=PRINTABLE, min_size=1, max_size=30), host=HOST, tail=TAIL,
       lead=st.sampled_from(["", "-i", "--index-url=", "url:", "see "]))
def test_any_password_without_whitespace_is_never_shown(scheme, user, password, host, tail, lead):
    """Any password (printable, no whitespace: '/', '?', '#', '@' and ':' among them; digits then '/'
    too, after a login of one word: round 15 S15a) is hidden, whatever follows the host, and the URL is
    refused as credentials."""
    start, rest = f"{lead}{scheme}://{user}:", f"@{host}/{tail}"
    url = f"{start}{password}{rest}"
    out = redacted(url)
    assert out.startswith(f"{start}***@") and rest.endswith(out[len(start) + 3:])   # all of the password hidden
    assert credentialed(data(vllm_pip_args=[url])) == ["vllm_pip_args[0]"]


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(["https", "git+https", "ssh"]), host=HOST,
       port=st.one_of(st.just(""), st.from_regex(r":[0-9]{0,5}", fullmatch=True)),
       path=st.text(alphabet=PRINTABLE.replace("=", ""), max_size=30).filter(lambda p: "//" not in f"/{p}"))
def test_a_url_without_userinfo_comes_back_as_it_is(scheme, host, port, path):
    """host[:port] then any path, query or fragment ('@' and ':' in it: a git ref, an e-mail) is no secret
    (a '//' in it would start a scheme-less URL, //TOKEN@host); but after host:port an '@' before a dotted
    host (john.doe:1234/TOKEN@pypi.corp: round 16 S16a) is a userinfo's end: tests/unit/test_round16.py."""
    url = f"{scheme}://{host}{port}/{path}"
    assume(not (port and re.search(r"@(?:[^/?#:@\s]*\.|localhost|\[)", path, re.I)))
    assert redacted(url) == url and credentialed(data(vllm_pip_args=[url])) == []
