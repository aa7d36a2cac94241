"""The one configuration table: parsing, errors that name the key, examples in step."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import config
from cluster.errors import ConfigError
from tests.helpers import REPO


@pytest.mark.parametrize("section", ["master", "node"])
def test_etc_examples_are_generated_from_the_table(section: str) -> None:
    """etc/*.conf document every default once; regenerate them if this fails."""
    assert (REPO / "etc" / f"{section}.conf").read_text() == config.example(section)


def test_examples_load_as_the_defaults() -> None:
    for section in ("master", "node"):
        assert config.load(REPO / "etc" / f"{section}.conf") == config.Config()


def test_values_are_converted_and_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text("[master]\nhome = h\nbase_port = 9100\nspeculate_tail = no\n"
                    "gs_configs = ppmraw.72.0 pbmraw.300.1\n[node]\nslots = 3\n"
                    "monitor_port = 9200\n")
    cfg = config.load(conf, {"poll_interval": "0.5"})
    assert cfg.home == tmp_path / "h" and cfg.port_for(2) == 9102
    assert cfg.speculate_tail is False and cfg.gs_configs == ("ppmraw.72.0", "pbmraw.300.1")
    assert cfg.effective_slots() == 3 and cfg.poll_interval == 0.5
    assert cfg.monitor_port == 9200  # a shared key is allowed in [node]


@pytest.mark.parametrize(("text", "overrides", "message"), [
    ("[master]\nbase_port = lots\n", {}, "'base_port'"),
    ("[master]\nno_such_key = 1\n", {}, "one of"),
    ("[elsewhere]\nx = 1\n", {}, "section [master] or [node]"),
    ("[master]\n", {"base_port": "70000"}, "TCP port"),
    ("[master]\n", {"poll_interval": "-1"}, "non-negative"),
    ("[node]\nnode_name = bad name\n", {}, "letters, digits"),
    ("[master]\n", {"speculate_tail": "maybe"}, "yes or no"),
    ("not ini at all", {}, "INI syntax"),
])
def test_errors_name_the_key_and_what_was_expected(tmp_path: Path, text: str,
                                                   overrides: dict[str, str],
                                                   message: str) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text(text)
    with pytest.raises(ConfigError) as exc:
        config.load(conf, overrides)
    assert message in str(exc.value)


def test_override_pairs_must_have_an_equals_sign() -> None:
    assert config.parse_overrides(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="key=value"):
        config.parse_overrides(["novalue"])
