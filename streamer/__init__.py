"""streamer: a streaming inference daemon for Ascend NPUs and any CPU."""

__version__ = "0.1.0"
