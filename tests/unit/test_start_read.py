"""``streamer run``'s first read of its config file: bounded, and its errors told apart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamer.errors import ConfigError, StreamerError
from streamer.start_read import read_at_start

ROOT = Path(__file__).resolve().parents[2]


def test_a_read_that_blocks_is_given_up_after_the_timeout(tmp_path: Path) -> None:
    """A FIFO nobody writes stands for a hung mount; once given up, a writer that opens and
    closes it lets the blocked read end (end of file: an empty config)."""
    fifo = tmp_path / "streamer.toml"
    os.mkfifo(fifo)
    with pytest.raises(StreamerError, match=r"streamer\.toml: not read in 0\.2 s") as hung:
        read_at_start(fifo, 0.2)
    assert not isinstance(hung.value, ConfigError), "an environment fault, not a config one"
    os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_a_good_file_is_read_and_a_bad_one_is_a_config_error(tmp_path: Path) -> None:
    assert read_at_start(ROOT / "configs" / "default.toml", 5.0).models[0].name == "face"
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nqueue_size = -1\n")
    with pytest.raises(ConfigError, match="daemon.queue_size"):
        read_at_start(bad, 5.0)
