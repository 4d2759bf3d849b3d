import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from streamer.cli import main
from streamer.config import MAX_CONFIG_BYTES, load_config
from streamer.errors import ConfigError
from streamer.vision.registry import PREPROCESSORS

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


MINIMAL = """
[[ingress]]
uri = "pull+bind:tcp://127.0.0.1:5555"
[[egress]]
uri = "pub+bind:tcp://127.0.0.1:5556"
[[models]]
name = "face"
path = "models/face.onnx"
preprocess = { kind = "letterbox" }
postprocess = { kind = "blazeface" }
"""


def test_default_config_loads() -> None:
    config = load_config(ROOT / "configs" / "default.toml")
    assert config.models[0].asset == "blazeface_short_range"
    assert config.runtime.backend == "onnxruntime"
    assert config.models[0].postprocess.params()["score_threshold"] == 0.75


def test_relative_model_path_resolves_against_the_config_folder(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL))
    assert config.model_path(config.models[0]) == tmp_path.resolve() / "models" / "face.onnx"


def test_a_symlinked_config_takes_relative_paths_from_its_target_folder(tmp_path: Path) -> None:
    """As README says: the folder of the config file itself, so a config and the models
    beside it can be linked from elsewhere."""
    (tmp_path / "real").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "c.toml").symlink_to(write(tmp_path / "real", MINIMAL))
    config = load_config(tmp_path / "etc" / "c.toml")
    expected = tmp_path.resolve() / "real" / "models" / "face.onnx"
    assert config.model_path(config.models[0]) == expected


def test_relative_curve_key_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "keys" / "clients").mkdir(parents=True)
    (tmp_path / "keys" / "server.key_secret").write_text("")
    text = MINIMAL.replace(
        'uri = "pull+bind:tcp://127.0.0.1:5555"',
        'uri = "pull+bind:tcp://127.0.0.1:5555"\n'
        'curve_secret_key_file = "keys/server.key_secret"\ncurve_clients_dir = "keys/clients"',
    )
    ingress = load_config(write(tmp_path, text)).ingress[0]
    assert ingress.curve_secret_key_file == tmp_path.resolve() / "keys" / "server.key_secret"
    assert ingress.curve_clients_dir == tmp_path.resolve() / "keys" / "clients"


def test_unknown_key_is_an_error_naming_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "\n[daemon]\ndrain_timeout = 3\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "daemon.drain_timeout" in str(info.value)
    assert str(path) in str(info.value)


def test_model_needs_exactly_one_of_path_and_asset(tmp_path: Path) -> None:
    text = MINIMAL.replace('path = "models/face.onnx"', 'path = "a.onnx"\nasset = "b"')
    with pytest.raises(ConfigError, match="exactly one of"):
        load_config(write(tmp_path, text))


def test_missing_sections_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ingress"):
        load_config(write(tmp_path, "[daemon]\n"))
    with pytest.raises(ConfigError, match="batch.max_size"):
        load_config(write(tmp_path, MINIMAL + "[models.batch]\nmax_size = 0\n"))


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ('[models.batch]\nmax_size = "8"\n', "models[0] ('face').batch.max_size"),
        ("[models.batch]\nmax_size = 8.0\n", "models[0] ('face').batch.max_size"),
        ("[daemon]\nqueue_size = true\n", "daemon.queue_size"),
        ('[daemon]\ndrain_timeout_s = "5"\n', "daemon.drain_timeout_s"),
        ('[runtime]\ndevices = ["0"]\n', "runtime.devices[0]"),
    ],
)
def test_values_of_the_wrong_type_are_errors_not_converted(
    tmp_path: Path, extra: str, key: str
) -> None:
    message = error(tmp_path, MINIMAL + extra)
    assert f"{key}: Input should be a valid" in message


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (
            ("[daemon]", "[daemon]\ndrain_timeout_s = inf"),
            "daemon.drain_timeout_s: Input should be a finite",
        ),
        (
            ("[daemon]", "[daemon]\nreorder_timeout_s = 1e300"),
            "daemon.reorder_timeout_s: Input should be less",
        ),
        (('kind = "letterbox" }', 'kind = "letterbox", mean = nan }'), None),
        (('5555"', '5555"\nhwm = 99999999999999999999'), "ingress[0].hwm: Input should be less"),
        (
            ('name = "face"', 'name = "face"\nreplicas = 1025'),
            "models[0] ('face').replicas: Input should be less",
        ),
        (
            ('name = "face"', "name = 1979-05-27"),
            "models[0].name: a date or time is not a valid value",
        ),
        (('5555"', '5555"\ntopics = [07:32:00]'), "ingress[0].topics[0]: a date or time is not a"),
    ],
)
def test_values_a_running_daemon_cannot_use_are_errors(
    tmp_path: Path, edit: tuple[str, str], says: str | None
) -> None:
    """Non-finite and overflowing numbers (they crashed the daemon at start, at a reload or
    at its stop) and TOML dates (they passed as ISO text)."""
    text = MINIMAL.replace(*edit) if edit[0] in MINIMAL else MINIMAL + edit[1] + "\n"
    if says is None:  # a plug-in parameter: checked when the pipeline is built
        config = load_config(write(tmp_path, text))
        with pytest.raises(ConfigError, match="preprocess.mean"):
            PREPROCESSORS.params(config.models[0].preprocess, "models[0].preprocess")
        return
    assert says in error(tmp_path, text)


def test_an_integer_fills_a_float_and_an_array_a_tuple(tmp_path: Path) -> None:
    text = MINIMAL + "[daemon]\ndrain_timeout_s = 3\n[runtime]\ndevices = [0, 1]\n"
    config = load_config(write(tmp_path, text))
    assert config.daemon.drain_timeout_s == 3.0 and config.runtime.devices == (0, 1)


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[daemon\n"))
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[daemon]\nqueue_size = " + "9" * 5000 + "\n"))
    with pytest.raises(ConfigError, match="invalid configuration: Exceeds the limit"):
        load_config(write(tmp_path, "[daemon]\nqueue_size = 0x" + "f" * 5000 + "\n"))
    deep = MINIMAL.replace('5555"', '5555"\ntopics = ' + "[" * 900 + "]" * 900)
    with pytest.raises(ConfigError, match="not valid TOML|invalid configuration"):
        load_config(write(tmp_path, deep))
    huge = write(tmp_path, MINIMAL + "#" * MAX_CONFIG_BYTES)  # a comment: valid TOML
    with pytest.raises(ConfigError, match="more than 16 MiB: not a config"):
        load_config(huge)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(MINIMAL.encode() + b"# caf\xe9\n")  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(latin)
    no_user = MINIMAL.replace('5555"', '5555"\ncurve_secret_key_file = "~nosuchuser0/k"')
    with pytest.raises(ConfigError, match=r"ingress.curve_secret_key_file: cannot expand"):
        load_config(write(tmp_path, no_user))


def test_a_byte_order_mark_is_taken(tmp_path: Path) -> None:
    """Editors on Windows start UTF-8 files with one: it was "Invalid statement (at line 1,
    column 1)"."""
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load_config(path).models[0].name == "face"


def test_http_address_takes_host_and_port(tmp_path: Path) -> None:
    def daemon(address: str) -> str:
        return MINIMAL + f'[daemon]\nhttp_address = "{address}"\n'

    assert load_config(write(tmp_path, MINIMAL)).daemon.http_endpoint == ("127.0.0.1", 9555)
    assert load_config(write(tmp_path, daemon("[::1]:0"))).daemon.http_endpoint == ("::1", 0)
    assert load_config(write(tmp_path, daemon(""))).daemon.http_endpoint is None
    for bad in ("127.0.0.1", "::1:9555", "localhost:99999", ":9555", "127.0.0.1:\u0667\u0669"):
        with pytest.raises(ConfigError, match="daemon.http_address"):
            load_config(write(tmp_path, daemon(bad)))
    # It said "write an IPv6 address in brackets" of one in brackets without a port.
    with pytest.raises(ConfigError, match=r"'\[::1\]': expected host:port, e.g. \[::1\]:9555"):
        load_config(write(tmp_path, daemon("[::1]")))


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return str(info.value)


@pytest.mark.parametrize(
    ("devices", "says"),
    [
        ("[]", "list one device id at least"),
        ("[0, -1]", "device ids are in 0..2147483647, got [0, -1]"),
        ("[0, 2147483648]", "device ids are in 0..2147483647, got [0, 2147483648]"),
        ("[1, 0, 1]", "device ids must be distinct, got [1, 0, 1]"),
    ],
)
def test_devices_are_one_or_more_distinct_ids(tmp_path: Path, devices: str, says: str) -> None:
    message = error(tmp_path, MINIMAL + f"[runtime]\ndevices = {devices}\n")
    assert f"runtime.devices: Value error, {says}" in message


def test_ingress_and_egress_names_are_unique(tmp_path: Path) -> None:
    second_ingress = '[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5557"\n'
    message = error(tmp_path, MINIMAL + second_ingress)
    assert "ingress: Value error, [[ingress]] names must be unique; ['ingress']" in message
    named = '[[egress]]\nname = "out"\nuri = "pub+bind:tcp://127.0.0.1:5558"\n'
    message = error(tmp_path, MINIMAL + named + named.replace("5558", "5559"))
    assert "egress: Value error, [[egress]] names must be unique; ['out']" in message
    assert load_config(write(tmp_path, MINIMAL + named)).egress[1].name == "out"


@pytest.mark.parametrize("table", ["ingress", "egress"])
@pytest.mark.parametrize("name", ["", "door cam", "cam:1", "\\u00e9t\\u00e9"])
def test_socket_names_are_plain_words(tmp_path: Path, table: str, name: str) -> None:
    """``name = ""`` named the thread ``ingress-`` and left empty labels in logs and metrics."""
    text = MINIMAL.replace(f"[[{table}]]\n", f'[[{table}]]\nname = "{name}"\n')
    shown = name.encode().decode("unicode_escape")
    says = f"{table}[0] ({shown!r}).name: Value error, {shown!r}: a socket name is letters, digits"
    assert says in error(tmp_path, text)


def test_topics_need_a_sub_ingress(tmp_path: Path) -> None:
    pull = MINIMAL.replace('5555"', '5555"\ntopics = ["cam1"]')
    assert "ingress[0].topics: Value error, `topics` applies to a `sub` ingress" in error(
        tmp_path, pull
    )
    sub = pull.replace("pull+bind:", "sub+connect:")
    assert load_config(write(tmp_path, sub)).ingress[0].topics == ("cam1",)


def test_a_failed_table_is_not_also_reported_as_missing(tmp_path: Path) -> None:
    message = error(tmp_path, MINIMAL + "[models.batch]\nmax_size = 0\n")
    assert (
        "models[0] ('face').batch.max_size: Input should be greater than or equal to 1" in message
    )
    assert "at least 1 item" not in message
    message = error(tmp_path, MINIMAL.replace('5555"', '5555"\nhwm = 0'))
    assert "ingress[0].hwm" in message and "at least 1 item" not in message
    empty = "ingress = []\n" + MINIMAL.replace(
        '[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5555"\n', ""
    )
    assert "ingress: Tuple should have at least 1 item after validation, not 0" in error(
        tmp_path, empty
    )


def test_a_key_in_a_table_list_names_the_table_as_the_file_does(tmp_path: Path) -> None:
    """Keys read ``models[0] ('face').batch.max_size``, not pydantic's ``models.0.batch...``:
    the file has ``[[models]]`` tables, found by their name."""
    text = (
        MINIMAL.replace("[[ingress]]\n", '[[ingress]]\nname = "door"\nhwm = 0\n')
        .replace("[[egress]]\n", '[[egress]]\nname = "out"\nhmw = 1\n')
        .replace('name = "face"', 'name = "face"\nreplicas = 0')
    )
    second = '[[models]]\nname = "eyes"\npath = "e.onnx"\ninput = "face:crops"\nreplicas = 0\n'
    message = error(tmp_path, text + second)
    assert "  ingress[0] ('door').hwm: Input should be greater than or equal to 1" in message
    assert "  egress[0] ('out').hmw: unknown key" in message
    assert "  models[0] ('face').replicas: Input should be greater" in message
    assert "  models[1] ('eyes').replicas: Input should be greater" in message
    assert ".0." not in message and ".1." not in message


def test_a_key_with_a_line_break_or_a_control_character_is_quoted(tmp_path: Path) -> None:
    """A quoted TOML key is any text: printed as written, a line break in it forged a line of
    the message (and an escape sequence wrote to the terminal); a model name is quoted too."""
    forged = '"x\\n  ingress[0].uri: fine\\u001b[2K"'
    message = error(tmp_path, MINIMAL.replace('name = "face"', f'name = "face"\n{forged} = 1'))
    assert message.count("\n") == 1 and "\x1b" not in message
    assert "  models[0] ('face').'x\\n  ingress[0].uri: fine\\x1b[2K': unknown key" in message
    top = error(tmp_path, f'"a\\nb" = 1979-05-27\n{MINIMAL}')
    assert top.endswith("\n  'a\\nb': a date or time is not a valid value")
    plain = error(tmp_path, f"dae-mon = 1\n{MINIMAL}")  # printable: as written
    assert "\n  dae-mon: unknown key (known: daemon, egress, ingress, models," in plain


URI = 'uri = "pull+bind:tcp://127.0.0.1:5555"'


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("5", "ingress[0].uri: Input should be a valid string or a valid array"),
        (
            '["pull+bind:tcp://127.0.0.1:5555", 3]',
            "ingress[0].uri[1]: Input should be a valid string",
        ),
        ('["a", { x = 1 }]', "ingress[0].uri[1]: Input should be a valid string"),
    ],
)
def test_a_setting_of_several_types_says_once_what_it_takes(
    tmp_path: Path, uri: str, says: str
) -> None:
    """``uri`` takes a string or a list of strings: pydantic reports each type it tried
    under a tag of its own (``uri.str``, ``uri.tuple[str, ...][1]``); the message names the
    key as written, with the errors of the type the value has."""
    message = error(tmp_path, MINIMAL.replace(URI, f"uri = {uri}"))
    assert message.splitlines()[1:] == [f"  {says}"]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('mean = "x"', ["mean: Input should be a valid number or a valid array"]),
        ('mean = [0.5, "x", 0.5]', ["mean[1]: Input should be a valid number"]),
        ("mean = [0.5, 0.5]", ["mean: Tuple should have 3 items, not 2"]),
        ('mean = ["x", 0.5]', ["mean[0]: Input should be", "mean: Tuple should have 3 items"]),
        ("size = [128]", ["size: Tuple should have 2 items, not 1"]),
    ],
)
def test_a_plug_in_setting_of_several_types_or_a_fixed_length_names_its_problem(
    tmp_path: Path, line: str, says: list[str]
) -> None:
    """``mean``/``std`` take a number or 3; a fixed-length tuple's missing items are its
    length, not ``mean[2]: Field required``."""
    preprocess = 'preprocess = { kind = "letterbox" }'
    text = MINIMAL.replace(preprocess, preprocess.replace(" }", f", {line} }}"))
    config = load_config(write(tmp_path, text))
    with pytest.raises(ConfigError) as info:
        PREPROCESSORS.params(config.models[0].preprocess, "models[0].preprocess")
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == len(says)
    for got, want in zip(lines, says, strict=True):
        assert got.startswith(f"  models[0].preprocess.{want}")
    assert "tuple[" not in str(info.value) and ".float" not in str(info.value)


def test_an_unknown_key_lists_the_known_ones_and_the_closest(tmp_path: Path) -> None:
    text = MINIMAL.replace('5555"', '5555"\nhmw = 10').replace(
        'name = "face"', 'name = "face"\nreplica = 2'
    )
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    message = str(info.value)
    assert (
        "ingress[0].hmw: unknown key (known: curve_clients_dir, curve_secret_key_file, hwm"
        in message
    )
    assert "did you mean 'hwm'?" in message
    assert (
        "models[0] ('face').replica: unknown key" in message
        and "did you mean 'replicas'?" in message
    )
    with pytest.raises(ConfigError, match="source_file: unknown key"):
        load_config(write(tmp_path, f'source_file = "x.toml"\n{MINIMAL}'))
    with pytest.raises(ConfigError) as top:
        load_config(write(tmp_path, f"demon = 1\n{MINIMAL}"))
    assert "source_file" not in str(top.value) and "did you mean 'daemon'?" in str(top.value)


def test_streamer_check_exits_2_without_devices(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["check", "--config", str(write(tmp_path, MINIMAL + "[runtime]\ndevices = []\n"))]
    )
    assert result.exit_code == 2
    assert "runtime.devices: Value error, list one device id at least" in result.output


def test_streamer_check_exits_2_for_a_bind_to_another_machines_address(tmp_path: Path) -> None:
    """It said ok, and `streamer run` failed at start (exit 1, "Cannot assign requested
    address")."""
    text = MINIMAL.replace("pull+bind:tcp://127.0.0.1:5555", "pull+bind:tcp://10.255.255.1:5555")
    path = write(tmp_path, text)
    result = CliRunner().invoke(main, ["check", "--config", str(path)])
    assert result.exit_code == 2
    says = f"error: {path}: ingress ingress: tcp://10.255.255.1:5555: cannot bind: the host is no"
    assert says in result.output


def test_streamer_check_names_the_file_for_a_plug_in_error(tmp_path: Path) -> None:
    text = MINIMAL.replace('{ kind = "blazeface" }', '{ kind = "blazeface", score_threshold = 2 }')
    path = write(tmp_path, text)
    result = CliRunner().invoke(main, ["check", "--config", str(path)])
    assert result.exit_code == 2
    assert f"error: {path}: models[0] ('face').postprocess: invalid parameters" in result.output


def test_streamer_check_refuses_a_max_detections_no_operator_can_take(tmp_path: Path) -> None:
    """``max_detections = 9223372036854775808`` passed ``check``, and with ``nms =
    "operator"`` every frame then failed (``postprocess_failed``: OverflowError)."""
    big = '{ kind = "blazeface", nms = "operator", max_detections = 9223372036854775808 }'
    path = write(tmp_path, MINIMAL.replace('{ kind = "blazeface" }', big))
    result = CliRunner().invoke(main, ["check", "--config", str(path)])
    assert result.exit_code == 2, result.output
    says = "models[0] ('face').postprocess.max_detections: Input should be less than or equal"
    assert says in result.output


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ('path = "models/face.onnx"', 'path = "face\\u0000.onnx"', "models[0] ('face').path"),
        ("tcp://127.0.0.1:5555", "ipc:///tmp/in\\u0000", "ingress[0].uri"),
    ],
    ids=["model-path", "ipc-path"],
)
def test_a_nul_character_in_a_setting_is_a_config_error(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    """TOML's ``\\u0000`` in a path: ``check`` and ``run`` died with a ValueError traceback
    ("embedded null byte") when the OS was asked for the file."""
    says = f"{key}: a NUL character (\\u0000) is not a valid value"
    assert says in error(tmp_path, MINIMAL.replace(old, new))


def test_the_reorder_window_covers_what_the_chain_can_have_in_flight(tmp_path: Path) -> None:
    """With the window below it, one replica's slow batch makes its source's later results,
    finished by the other replicas, overflow the window: out of order (``reorder_gave_up``)."""
    default = load_config(ROOT / "configs" / "default.toml")
    assert default.frames_in_flight() == 64 + (1 * 2 * (2 + 2) + 1) * 8
    assert default.reorder_window() == 4096  # at least: a failed replica's frames come late
    many = MINIMAL.replace('name = "face"', 'name = "face"\nreplicas = 64\nmax_in_flight = 3')
    config = load_config(write(tmp_path, f"[runtime]\ndevices = [0, 1]\n{many}"))
    assert config.reorder_window() == config.frames_in_flight() == 64 + (2 * 64 * 5 + 1) * 8
    gears = MINIMAL.replace('name = "face"', 'name = "face"\nbatch = { gears = [1, 16] }')
    assert load_config(write(tmp_path, gears)).frames_in_flight() == 64 + (1 * 4 + 1) * 16
    small = load_config(write(tmp_path, f"[daemon]\nreorder_window = 4\n{MINIMAL}"))
    assert small.reorder_window() == 4  # as set; the pipeline warns that it is small


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "daemon.max_sources: Input should be greater than or equal to 1"),
        ("2147483648", "daemon.max_sources: Input should be less than or equal to"),
        ('"8"', "daemon.max_sources: Input should be a valid integer"),
    ],
)
def test_max_sources_is_a_positive_count(tmp_path: Path, value: str, says: str) -> None:
    assert load_config(write(tmp_path, MINIMAL)).daemon.max_sources == 4096
    assert says in error(tmp_path, MINIMAL + f"[daemon]\nmax_sources = {value}\n")


def test_streamer_check_refuses_a_model_path_that_is_no_regular_file(tmp_path: Path) -> None:
    """/dev/zero as a model's ``path`` was read until the memory ran out. (A FIFO is left
    to block, as a file on a hung mount does: tests/e2e/test_operations.py.)"""
    config = write(tmp_path, MINIMAL)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "face.onnx").symlink_to("/dev/zero")
    done = subprocess.run(
        [sys.executable, "-m", "streamer", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    link = tmp_path.resolve() / "models" / "face.onnx"
    assert f"error: {config}: model 'face': {link} is not a regular file" in done.stderr


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ('path = "~streamer-no-such-user/face.onnx"', "models[0].path: cannot expand"),
        (f'path = "{"x" * 300}.onnx"', "File name too long"),
        (f'asset = "{"x" * 300}"', "models[0] ('face').asset: unknown 'xxx"),
    ],
    ids=["unknown-user", "long-path", "long-asset"],
)
def test_streamer_check_exits_2_for_a_model_file_name_it_cannot_look_up(
    tmp_path: Path, model: str, says: str
) -> None:
    """A ``~user`` of no such user, or a name longer than the system takes: a RuntimeError
    or OSError traceback (exit 1) instead of a message naming the key or file."""
    path = write(tmp_path, MINIMAL.replace('path = "models/face.onnx"', model))
    result = CliRunner().invoke(main, ["check", "--config", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"error: {path}: " in result.output and says in result.output


def test_streamer_check_gives_up_on_a_config_nobody_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO nobody writes (or a hung mount): check waited forever in a deploy script."""
    monkeypatch.setattr("streamer.cli._START_READ_TIMEOUT_S", 0.3)
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    try:
        result = CliRunner().invoke(main, ["check", "--config", str(fifo)])
        assert result.exit_code == 1, result.output
        assert f"error: {fifo}: not read in 0.3 s (a hung mount?)" in result.output
    finally:
        os.close(os.open(fifo, os.O_WRONLY))  # an empty write end: the read thread ends
