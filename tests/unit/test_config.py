"""The one configuration table: parsing, errors that name the key, examples in step."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from cluster import config, configfile
from cluster.cli import config_example
from cluster.errors import ConfigError
from tests.helpers import REPO


@pytest.mark.parametrize("section", ["master", "node"])
def test_etc_examples_are_generated_from_the_table(section: str) -> None:
    """etc/*.conf document every default once; regenerate them if this fails."""
    assert (REPO / "etc" / f"{section}.conf").read_text() == configfile.example(section)


def test_examples_load_as_the_defaults() -> None:
    for section in ("master", "node"):
        assert configfile.load(REPO / "etc" / f"{section}.conf") == config.Config()


def test_the_defaults_pass_validation() -> None:
    assert configfile.load(None) == config.Config()
    configfile.validate(config.Config())


def test_values_are_converted_and_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "c.conf"
    conf.write_text("[master]\nhome = h\nbase_port = 9100\nspeculate_tail = no\n"
                    "gs_configs = ppmraw.72.0 pbmraw.300.1\n[node]\nslots = 3\n"
                    "monitor_port = 9200\n")
    cfg = configfile.load(conf, {"poll_interval": "0.5"})
    assert cfg.home == tmp_path / "h" and cfg.port_for(2) == 9102
    assert cfg.speculate_tail is False and cfg.gs_configs == ("ppmraw.72.0", "pbmraw.300.1")
    assert cfg.effective_slots() == 3 and cfg.poll_interval == 0.5
    assert cfg.monitor_port == 9200  # a shared key is allowed in [node]


@pytest.mark.parametrize(("text", "overrides", "message"), [
    ("[master]\nbase_port = lots\n", {}, "'base_port'"),
    ("[master]\nno_such_key = 1\n", {}, "one of"),
    ("[elsewhere]\nx = 1\n", {}, "section [master] or [node]"),
    ("[master]\n", {"base_port": "70000"}, "TCP port"),
    ("[master]\n", {"poll_interval": "-1"}, "above 0, up to 3600"),
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
        configfile.load(conf, overrides)
    assert message in str(exc.value)


def test_override_pairs_must_have_an_equals_sign() -> None:
    assert configfile.parse_overrides(["a=1", "b=x=y"]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError, match="key=value"):
        configfile.parse_overrides(["novalue"])


CRON_EXPECTED = "a cron schedule of five fields such as '0 1 * * *' or an @special"
SCHEDULE_KEYS = ["nightly_schedule", "weekly_schedule", "clusterpull_schedule"]


def test_every_cron_schedule_key_is_checked() -> None:
    """The schedule keys tested below are all the keys whose unit is 'cron schedule'."""
    assert sorted(f.name for f in dataclasses.fields(config.Config)
                  if f.metadata["unit"] == "cron schedule") == sorted(SCHEDULE_KEYS)


@pytest.mark.parametrize("key", SCHEDULE_KEYS)
@pytest.mark.parametrize("value", ["every ten minutes", "", "0 1 * *", "0 1 * * * *",
                                   "61 * * * *", "0 24 * * *", "0 0 32 * *", "@fortnightly"])
def test_a_bad_cron_schedule_is_refused_at_load(tmp_path: Path, key: str, value: str) -> None:
    """Not only when the crontab is installed: load names the key and the expected form."""
    section = "node" if key == "clusterpull_schedule" else "master"
    conf = tmp_path / "c.conf"
    conf.write_text(f"[{section}]\n{key} = {value}\n")
    for path, overrides in ((conf, {}), (None, {key: value})):
        with pytest.raises(ConfigError) as exc:
            configfile.load(path, overrides)
        assert exc.value.key == key
        assert f"config key {key!r}" in str(exc.value) and CRON_EXPECTED in str(exc.value)


@pytest.mark.parametrize("key", SCHEDULE_KEYS)
@pytest.mark.parametrize("value", ["30 2 * * *", "*/5 1-3 * * mon-fri", "0 0 1 jan *",
                                   "@daily", "@weekly", "@hourly"])
def test_good_cron_schedules_load_unchanged(key: str, value: str) -> None:
    assert getattr(configfile.load(None, {key: value}), key) == value


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("smtp_port", "0", "an integer from 1 to 65535 (TCP port)"),
    ("smtp_port", "65536", "an integer from 1 to 65535 (TCP port)"),
    ("smtp_port", "-25", "an integer from 1 to 65535 (TCP port)"),
    ("smtp_port", "twenty-five", "an integer from 1 to 65535 (TCP port)"),
    ("smtp_port", "25.5", "an integer from 1 to 65535 (TCP port)"),
    ("gs_memory_kb", "0", "an integer from 1 to 1073741824 (KiB)"),
    ("gs_memory_kb", "-1000", "an integer from 1 to 1073741824 (KiB)"),
    ("max_line_bytes", "0", "an integer from 1 to 16777216 (bytes)"),
    ("batch_per_slot", "0", "an integer from 1 to 10000 (jobs)"),
    ("connect_retries", "0", "an integer from 1 to 1000 (attempts)"),
    ("min_ram_mb", "-1", "an integer from 0 to 16777216 (MiB)"),
    ("max_timeouts", "-1", "an integer from 0 to 1000000 (tests)"),
    ("slots", "-1", "0 (CPU count) or a positive integer"),
    ("io_timeout", "0", "a number above 0, up to 86400 (seconds)"),
    ("job_timeout", "0", "a number above 0, up to 86400 (seconds)"),
    ("heartbeat_timeout", "0", "a number above 0, up to 86400 (seconds)"),
    ("supervisor_interval", "0", "a number above 0, up to 3600 (seconds)"),
    ("poll_interval", "0", "a number above 0, up to 3600 (seconds)"),
    ("linger", "-1", "a number from 0 to 3600 (seconds)"),
    ("poll_interval", "nan", "a number above 0, up to 3600 (seconds)"),
    ("job_timeout", "inf", "a number above 0, up to 86400 (seconds)"),
    ("linger", "-inf", "a number from 0 to 3600 (seconds)"),
    ("linger", "1e308", "a number from 0 to 3600 (seconds)"),
    ("linger", "3600.001", "a number from 0 to 3600 (seconds)"),
    ("batch_per_slot", "99999999999999999999", "an integer from 1 to 10000 (jobs)"),
    ("batch_per_slot", "10001", "an integer from 1 to 10000 (jobs)"),
    ("max_request_bytes", "1" + "0" * 30, "an integer from 1 to 4294967296 (bytes)"),
    ("slots", "1000000", "an integer from 0 to 4096 (jobs)"),
])
def test_numbers_out_of_range_are_refused_naming_key_and_form(key: str, value: str,
                                                              expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        configfile.load(None, {key: value})
    assert exc.value.key == key and exc.value.expected == expected
    assert f"config key {key!r}" in str(exc.value) and expected in str(exc.value)


@pytest.mark.parametrize(("key", "value"), [
    ("smtp_port", "1"), ("smtp_port", "65535"), ("smtp_port", "587"),
    ("min_ram_mb", "0"), ("max_timeouts", "0"), ("slots", "0"),
    ("linger", "0"), ("upload_timeout", "0"), ("kill_grace", "0"), ("report_interval", "0"),
    ("journal_sync_interval", "0"), ("pid_wait", "0"), ("batch_seconds", "0"),
    ("connect_retry_delay", "0"), ("io_timeout", "0.5"), ("gs_memory_kb", "1"),
])
def test_in_range_values_load_including_a_meaningful_zero(key: str, value: str) -> None:
    """0 means 'no limit', 'at once', 'do not wait' ... for these; and small values are fine."""
    cfg = configfile.load(None, {key: value})
    assert getattr(cfg, key) == type(getattr(config.Config(), key))(value)


def test_every_numeric_default_is_in_range() -> None:
    """A positive field's default is > 0, every other number's >= 0, and every number has
    an upper bound its default is within (defaults unchanged)."""
    numeric = [f for f in dataclasses.fields(config.Config) if f.type in ("int", "float")]
    assert len(numeric) > 30
    for f in numeric:
        assert f.default > 0 if f.metadata["positive"] else f.default >= 0, f.name
        assert f.metadata["high"] is not None and f.default <= f.metadata["high"], f.name


@pytest.mark.parametrize("key", [f.name for f in dataclasses.fields(config.Config)
                                 if f.type in ("int", "float")])
def test_every_number_takes_its_bound_and_refuses_past_it(key: str) -> None:
    """The upper bound itself loads; the next integer (or a bit more) past it and 1e308 are
    refused naming the key, the value and the range."""
    f = {f.name: f for f in dataclasses.fields(config.Config)}[key]
    high = f.metadata["high"]
    shown = str(int(high)) if f.type == "int" else repr(float(high))
    assert getattr(configfile.load(None, {key: shown}), key) == high
    past = str(int(high) + 1) if f.type == "int" else repr(float(high) * 1.0001)
    for value in (past, "1e308" if f.type == "float" else "9" * 40):
        with pytest.raises(ConfigError) as exc:
            configfile.load(None, {key: value})
        assert exc.value.key == key, value
        text = str(exc.value)
        assert f"config key {key!r}" in text and configfile.range_text(f) in text, text


@pytest.mark.parametrize("section", ["master", "node"])
def test_the_example_command_prints_the_etc_file(section: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """`python3 -m cluster.cli.config_example <section>` is how etc/*.conf are made."""
    assert config_example.main([section]) == 0
    assert capsys.readouterr().out == (REPO / "etc" / f"{section}.conf").read_text()


def test_master_home_of_an_ssh_node_is_kept_as_written(tmp_path: Path) -> None:
    conf = tmp_path / "node.conf"
    conf.write_text("[node]\ntransport = ssh\nmaster_home = cluster-home\n")
    assert configfile.load(conf).master_home == Path("cluster-home")
    conf.write_text("[node]\ntransport = ssh\nmaster_home = ~/homes/cluster\n")
    assert configfile.load(conf).master_home == Path("~/homes/cluster")
    # A local node's home is a local path: expanded, and made absolute against the file.
    conf.write_text("[node]\nmaster_home = cluster-home\n")
    assert configfile.load(conf).master_home == tmp_path / "cluster-home"
    assert configfile.load(None, {"transport": "ssh", "master_home": "h"}).master_home == Path("h")
