"""``python -m streamer``."""

from streamer.entry import main

main()
