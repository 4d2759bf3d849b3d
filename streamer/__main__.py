"""``python -m streamer``."""

from streamer.cli import main

main()
