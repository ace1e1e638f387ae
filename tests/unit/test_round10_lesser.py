"""Round 10 of issue 61, lesser cases: each refused at its reader (see /tmp/redteam/round10.md)."""

from rigup import fleet


def test_n1_build_ratio_strips_ascii_blanks_alone():
    """N1: 'ratio=1.5\\x85' read 1.5 (str.strip() inside next() took U+0085); ASCII's blanks alone now."""
    for line, want in (("ratio=1.5\x85", None), ("ratio=1.5\u2028", None), ("ratio=1.5\xa0", None),
                       ("ratio= 1.5\t\r", 1.5), ("ratio=1.02", 1.02)):
        got = fleet.parse_build_ratio([line])
        print(f"parse_build_ratio([{line!r}]) -> {got!r} (want {want!r})")
        assert got == want
