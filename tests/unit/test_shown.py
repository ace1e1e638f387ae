"""rigup/text.py: text from hosts and hubs reaches the operator's terminal as text (issue 47). Each
class of hostile text a host can put in a GGUF's architecture, a progress file's error, an Xid
line, a journal, a CPU model name or a kernel release: escaped, one line, bounded."""

import pytest

from rigup.text import say, shown, shown_lines

HOSTILE = {
    "an escape sequence (colour, title, clear)": "llama\x1b[2J\x1b]0;pwned\x07",
    "a C1 CSI": "arch\x9b31m",
    "a carriage return over the line": "ok\rFAILED",
    "a newline that forges a line": "gemma\n    [lab2] converged (0 changed)",
    "a bidi override": "model\u202egnp.exe",
    "NUL and DEL": "a\x00b\x7f",
    "a line separator": "a\u2028b",
}


@pytest.mark.parametrize("what", HOSTILE)
def test_hostile_text_is_shown_escaped_on_one_line(what, capsys):
    text = HOSTILE[what]
    safe = shown(text)
    assert safe.isprintable() and "\n" not in safe, (what, safe)
    say(f"    [lab1] cpu: {text}", fg="red")
    err = capsys.readouterr().err
    printed = err.replace("\x1b[31m", "").replace("\x1b[0m", "").rstrip("\n")   # click's own colour only
    assert printed.isprintable(), (what, printed)
    print(f"{what}: {safe}")


def test_long_text_is_cut_and_says_so():
    assert shown("x" * 5000, 100) == "x" * 100 + "... (4900 more characters)"


def test_a_journal_keeps_its_lines_each_escaped():
    journal = "\n".join(["start", "evil \x1b[1;1H\x1b[2Jcleared", *[f"line {i}" for i in range(100)]])
    out = shown_lines(journal, limit=40, last=60)
    assert len(out.splitlines()) == 60 and all(line.isprintable() for line in out.splitlines())
    assert shown_lines("a\x1bb\nc") == "a\\x1bb\nc"
