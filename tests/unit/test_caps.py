"""Unit tests of cluster.node.caps and cluster.wire.caps (port of sendCaps.pl)."""

from __future__ import annotations

import platform

import pytest

from cluster.node.caps import TOOLS, detect, parse_compiler_banner
from cluster.wire.caps import Caps, caps_tools, parse_caps, suitable

SAMPLE = Caps("Linux", "x86_64", 64, "gcc-12.2.0", 2, 23975, ("gs", "md5sum", "mutool"))


def test_detect_gives_sane_values_on_this_machine() -> None:
    """detect() reports this machine's OS, at least one CPU, some RAM and known tools."""
    caps = detect()
    assert caps.os == platform.system()
    assert caps.cpus >= 1
    assert caps.ram_mb > 0
    assert caps.bits in (32, 64)
    assert set(caps.tools) <= set(TOOLS)
    assert list(caps.tools) == sorted(caps.tools)
    assert caps.compiler == "none" or "-" in caps.compiler


def test_detect_without_a_compiler_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty PATH no tool and no compiler is found, and detect() does not raise."""
    monkeypatch.setenv("PATH", "")
    caps = detect()
    assert caps.compiler == "none"
    assert caps.tools == ()
    assert "cc=none" in caps.format() and "tools=none" in caps.format()


def test_format_is_one_line_of_key_value_words() -> None:
    """format() gives the documented line."""
    assert SAMPLE.format() == ("os=Linux arch=x86_64 bits=64 cc=gcc-12.2.0 cpus=2 "
                               "ram_mb=23975 tools=gs,md5sum,mutool")


def test_format_removes_spaces_and_equals_from_values() -> None:
    """A value with a space or '=' cannot break the word structure."""
    odd = Caps("Some OS", "a=b", 64, "", 1, 1, ())
    words = odd.format().split()
    assert len(words) == 7
    assert parse_caps(odd.format())["os"] == "Some_OS"
    assert parse_caps(odd.format())["arch"] == "a_b"
    assert parse_caps(odd.format())["cc"] == "unknown"


def test_format_parse_round_trip() -> None:
    """parse_caps(format()) gives back every field as text."""
    parsed = parse_caps(detect().format())
    assert set(parsed) == {"os", "arch", "bits", "cc", "cpus", "ram_mb", "tools"}
    parsed = parse_caps(SAMPLE.format())
    assert parsed == {"os": "Linux", "arch": "x86_64", "bits": "64", "cc": "gcc-12.2.0",
                      "cpus": "2", "ram_mb": "23975", "tools": "gs,md5sum,mutool"}
    assert caps_tools(parsed) == {"gs", "md5sum", "mutool"}


def test_parse_caps_ignores_malformed_words() -> None:
    """Words without '=' or with an empty key are skipped; the rest is kept."""
    assert parse_caps("garbage os=Linux =x ram_mb=5 a==b  ") == \
        {"os": "Linux", "ram_mb": "5", "a": "=b"}
    assert parse_caps("") == {}


@pytest.mark.parametrize(("banner", "command", "expected"), [
    ("cc (Debian 12.2.0-14) 12.2.0\nCopyright (C) 2022 Free Software Foundation, Inc.\n",
     "cc", "gcc-12.2.0"),
    ("gcc (GCC) 11.4.1 20230605 (Red Hat 11.4.1-2)\n", "gcc", "gcc-11.4.1"),
    ("Apple clang version 15.0.0 (clang-1500.1.0.2.5)\nTarget: arm64\n", "cc", "clang-15.0.0"),
    ("Debian clang version 14.0.6\n", "cc", "clang-14.0.6"),
    ("tcc version 0.9.27\n", "cc", "cc-0.9.27"),
    ("no version here\n", "cc", "none"),
    ("", "cc", "none"),
])
def test_parse_compiler_banner(banner: str, command: str, expected: str) -> None:
    """The compiler is named by its banner and versioned by the first dotted number."""
    assert parse_compiler_banner(banner, command) == expected


def test_suitable_when_everything_is_there() -> None:
    """Caps with the tools and RAM needed are suitable, with an empty reason."""
    assert suitable(SAMPLE.format(), ["gs", "md5sum"], 1024) == (True, "")
    assert suitable(SAMPLE.format(), []) == (True, "")


def test_suitable_names_missing_tools_and_ram() -> None:
    """The reason lists every missing tool and a RAM shortfall."""
    ok, reason = suitable(SAMPLE.format(), ["gs", "make", "git"], 100000)
    assert not ok
    assert "missing tools: git, make" in reason
    assert "ram_mb 23975 is below 100000" in reason


def test_suitable_with_no_tools_or_no_ram_field() -> None:
    """tools=none has no tools; caps without ram_mb fail a RAM requirement, saying so."""
    ok, reason = suitable("os=Linux tools=none", ["gs"])
    assert not ok and reason == "missing tools: gs"
    ok, reason = suitable("os=Linux ram_mb=lots", [], 10)
    assert not ok and "no valid ram_mb" in reason and "'lots'" in reason
    ok, reason = suitable("", ["md5sum"], 1)
    assert not ok and "md5sum" in reason and "ram_mb" in reason
