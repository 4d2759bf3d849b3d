"""Loading a chain's stages with real models: tensor links checked at start, and the
postprocessor of a tensor stage seeing the chain as one model."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
from click.testing import CliRunner

from streamer.cli import main
from streamer.config import Config, load_config
from streamer.errors import BackendError, ConfigError, ModelError
from streamer.model_stages import ModelStage, load_chain
from streamer.runtime import Backend, QueueModel, open_backend
from streamer.vision.postprocess import BlazeFace

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def backend(assets: dict[str, Path]) -> Iterator[Backend]:
    config = load_config(ROOT / "configs" / "blazeface_split.toml")
    with open_backend(config.runtime) as opened:
        yield opened


def split_config(tmp_path: Path, edit: str = "", head_post: str = "blazeface") -> Config:
    text = (ROOT / "configs" / "blazeface_split.toml").read_text()
    text = text.replace('kind = "blazeface"', f'kind = "{head_post}"')
    text = text.replace('input = "backbone:tensor"', f'input = "backbone:tensor{edit}"')
    path = tmp_path / "split.toml"
    path.write_text(text)
    return load_config(path)


def load(backend: Backend, config: Config) -> list[ModelStage]:
    stages = load_chain(backend, config)
    for stage in reversed(stages):
        stage.close()
    return stages


def test_the_backbone_hands_on_and_the_head_postprocess_sees_the_image_input(
    backend: Backend, tmp_path: Path
) -> None:
    backbone, head = load(backend, split_config(tmp_path))
    assert backbone.link is not None and backbone.link.sources == (0, 1)
    assert backbone.postprocess is None and backbone.preprocess is not None
    assert head.preprocess is None and isinstance(head.postprocess, BlazeFace)
    assert head.postprocess.variant.input_size == 128  # from the backbone's image input
    assert head.tensor_fed and not backbone.tensor_fed


def test_a_map_that_swaps_the_feature_maps_fails_at_start(backend: Backend, tmp_path: Path) -> None:
    config = split_config(tmp_path, ":activation_11=activation_16,activation_16=activation_11")
    with pytest.raises(ConfigError, match="does not fit stage 'head' input 'activation_16'"):
        load_chain(backend, config)


def test_a_tensor_stage_cannot_be_an_item_stage(backend: Backend, tmp_path: Path) -> None:
    config = split_config(tmp_path, head_post="mtcnn_onet")
    with pytest.raises(ConfigError) as caught:
        load_chain(backend, config)
    assert (
        "models[1] ('head').postprocess.kind: a stage fed through the tensor adapter cannot be an "
        in (str(caught.value))
    )


def test_plug_in_parameters_are_checked_before_a_model_loads(
    backend: Backend, tmp_path: Path
) -> None:
    """The backend reads the letterbox's normalisation keys while loading (into the graph,
    the default config's normalize = "model"); a bad one is reported by the plug-in, naming
    the stage, as for any other key."""
    text = (ROOT / "configs" / "default.toml").read_text()
    text = text.replace("mean = [0.5, 0.5, 0.5]", 'mean = ["0.5", 0.5, 0.5]')
    path = tmp_path / "default.toml"
    path.write_text(text)
    with pytest.raises(
        ConfigError, match=r"models\[0\] \('face'\)\.preprocess: invalid parameters"
    ):
        load_chain(backend, load_config(path))


class _ClosesTogether:
    """A replica's real model whose close first waits for every replica's close to have
    begun: closed one after another, the first would wait forever (BrokenBarrierError)."""

    def __init__(self, model: QueueModel, barrier: threading.Barrier, fails: bool) -> None:
        self.model, self._barrier, self._fails = model, barrier, fails

    def close(self) -> None:
        self._barrier.wait(timeout=30)
        self.model.close()
        if self._fails:
            raise BackendError("release failed")


def test_replicas_close_at_once_and_all_of_them_even_when_one_fails(
    backend: Backend, tmp_path: Path
) -> None:
    """A wedged model waits out its close timeout; replicas must not add those waits up."""
    text = (ROOT / "configs" / "default.toml").read_text()
    path = tmp_path / "default.toml"
    path.write_text(text.replace("replicas = 2 ", "replicas = 3 "))
    (stage,) = load_chain(backend, load_config(path))
    barrier = threading.Barrier(3)
    wrapped = [_ClosesTogether(m, barrier, fails=i == 0) for i, (_, m) in enumerate(stage.models)]
    stage.models = [(0, cast(QueueModel, w)) for w in wrapped]
    with pytest.raises(BackendError, match="release failed"):
        stage.close()
    assert not barrier.broken
    for w in wrapped:  # every replica is closed: its enqueue is refused
        with pytest.raises(BackendError, match="is closed"):
            w.model.enqueue([])


def test_an_asset_not_fetched_names_the_cache_and_the_command(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service reads its own cache (STREAMER_CACHE in the units): the message says which."""
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConfigError) as caught:
        load_chain(backend, load_config(ROOT / "configs" / "default.toml"))
    assert str(caught.value) == (
        "models[0] ('face').asset: 'blazeface_short_range' is not fetched (no "
        f"{tmp_path / 'cache' / 'models' / 'blazeface_short_range.onnx'}): run `streamer models "
        f"fetch blazeface_short_range` with STREAMER_CACHE={tmp_path / 'cache'}"
    )


def test_a_cache_path_that_cannot_be_read_is_a_config_error(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a traceback (exit 1, restarted by systemd): exit 2 naming the path and why."""
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path / ("x" * 300)))
    with pytest.raises(
        ConfigError, match=r"models\[0\] \('face'\)\.asset: cannot read .*File name too long"
    ):
        load_chain(backend, load_config(ROOT / "configs" / "default.toml"))


def test_a_damaged_asset_is_refused_before_it_loads_and_listed_damaged(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, assets: dict[str, Path]
) -> None:
    """A cached model that no longer matches its digest (here: truncated) is a model error
    saying how to make it again, and ``models list`` shows it damaged (exit code 1)."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    model = assets["blazeface_short_range"]
    for source in (model, model.with_name(model.name + ".sha256")):
        shutil.copy(source, cache / "models")
    copied = cache / "models" / model.name
    copied.write_bytes(copied.read_bytes()[:1000])
    monkeypatch.setenv("STREAMER_CACHE", str(cache))
    with pytest.raises(ModelError, match=r"\.asset: .* is damaged .*`streamer models fetch blaze"):
        load_chain(backend, load_config(ROOT / "configs" / "default.toml"))
    listed = CliRunner().invoke(main, ["models", "list"])
    assert listed.exit_code == 1, listed.output
    line = next(x for x in listed.output.splitlines() if " blazeface_short_range " in x)
    assert line.split()[:3] == ["model", "blazeface_short_range", "damaged"]
    assert "`streamer models fetch` makes the damaged and unverified ones again" in listed.output


def test_an_unverified_asset_that_cannot_load_points_at_list_and_fetch(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache made before digests existed is taken as it is; when its model does not load,
    the error says where to look."""
    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "blazeface_short_range.onnx").write_bytes(b"\x08\x07 truncated")
    monkeypatch.setenv("STREAMER_CACHE", str(cache))
    with pytest.raises(ModelError, match=r"cannot load .*`streamer models list` tells .* damaged"):
        load_chain(backend, load_config(ROOT / "configs" / "default.toml"))


def test_a_model_that_does_not_fit_in_graph_preprocessing_is_a_config_error(
    backend: Backend, tmp_path: Path
) -> None:
    """The letterbox of default.toml on MTCNN's ONet (NHWC 48x48): the config is at fault, so
    the message does not send the user to check the cache (exit 2 either way)."""
    text = (ROOT / "configs" / "default.toml").read_text()
    path = tmp_path / "onet.toml"
    path.write_text(text.replace('asset = "blazeface_short_range"', 'asset = "mtcnn_onet"'))
    with pytest.raises(ConfigError) as caught:
        load_chain(backend, load_config(path))
    assert str(caught.value) == (
        "model 'face': normalize = \"model\" cannot compose the preprocessing into "
        "mtcnn_onet.onnx: input 'input_3' has 48 channels, expected 3"
    )


def test_a_gear_too_big_for_this_machine_fails_at_start(backend: Backend, tmp_path: Path) -> None:
    """A gear of a million rows (183 GiB of BlazeFace input) passed the config check and
    stopped the daemon at its first frame (MemoryError in the batcher)."""
    text = (ROOT / "configs" / "default.toml").read_text()
    path = tmp_path / "huge.toml"
    path.write_text(text.replace("gears = []", "gears = [1000000]"))
    with pytest.raises(
        ConfigError, match=r"models\[0\] \('face'\)\.batch: an execution of 1000000 rows"
    ):
        load_chain(backend, load_config(path))
    path.write_text(text.replace("gears = []", "gears = [4, 16]"))
    load(backend, load_config(path))  # a gear above max_size pads a full batch: allowed


def test_a_crops_stage_behind_one_without_detections_fails_at_start(
    backend: Backend, tmp_path: Path
) -> None:
    """O-Net cropping the detections of R-Net used as a whole-frame classifier: there are
    none, so it would never run; ``streamer check`` said ok."""
    text = (ROOT / "configs" / "face_classifier.toml").read_text()
    text += '\n[[models]]\nname = "onet"\nasset = "mtcnn_onet"\ninput = "rnet:crops"\n'
    text += '[models.postprocess]\nkind = "mtcnn_onet"\n'
    path = tmp_path / "classify_then_crops.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"models\[1\] \('onet'\)\.input: 'rnet:crops' crops the"):
        load_chain(backend, load_config(path))


def blazeface_then(tmp_path: Path, asset: str, kind: str = "mtcnn_onet") -> Config:
    """configs/blazeface_onet.toml with its O-Net stage running ``asset`` as ``kind``."""
    text = (ROOT / "configs" / "blazeface_onet.toml").read_text()
    text = text.replace('asset = "mtcnn_onet"', f'asset = "{asset}"')
    text = text.replace('kind = "mtcnn_onet"', f'kind = "{kind}"')
    path = tmp_path / f"blazeface_{asset}.toml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(
    ("asset", "wrong"),
    [
        ("blazeface_short_range", "input 'input' is [-1, 3, 128, 128]: this stage sends 48x48x3"),
        ("mtcnn_rnet", "is [-1, 24, 24, 3]: this stage sends 48x48x3 crops"),
    ],
)
def test_a_crops_stage_whose_model_does_not_take_its_crops_fails_at_start(
    backend: Backend, tmp_path: Path, asset: str, wrong: str
) -> None:
    """O-Net's stage on another net's model: ``streamer check`` said ok, and every frame
    with a face then failed as ``inference_failed`` (replica failures, then the stop)."""
    with pytest.raises(
        ConfigError, match=r"models\[1\] \('onet'\)\.postprocess: mtcnn_onet: "
    ) as caught:
        load_chain(backend, blazeface_then(tmp_path, asset))
    assert wrong in str(caught.value)


def test_an_item_stage_whose_outputs_are_another_nets_fails_at_start(
    backend: Backend, tmp_path: Path
) -> None:
    """P-Net's stage on O-Net's model: its three outputs would fail every frame as
    ``postprocess_failed``."""
    text = (ROOT / "configs" / "mtcnn.toml").read_text()
    path = tmp_path / "pnet_on_onet.toml"
    path.write_text(text.replace('asset = "mtcnn_pnet"', 'asset = "mtcnn_onet"', 1))
    with pytest.raises(
        ConfigError, match=r"models\[0\] \('pnet'\)\.postprocess: mtcnn_pnet: .*last axes"
    ):
        load_chain(backend, load_config(path))


def test_a_crops_item_stage_reading_the_frame_fails_at_start(
    backend: Backend, tmp_path: Path
) -> None:
    """R-Net's ``mtcnn_rnet`` stage alone: it crops upstream detections, has none, and every
    frame was published with no result at all (``model`` ""); ``streamer check`` said ok."""
    text = (ROOT / "configs" / "face_classifier.toml").read_text()
    path = tmp_path / "rnet_alone.toml"
    text = text.replace('kind = "mtcnn_classify"', 'kind = "mtcnn_rnet"')
    path.write_text(text.replace("threshold = 0.7", "score_threshold = 0.7"))
    with pytest.raises(
        ConfigError, match=r"models\[0\] \('rnet'\)\.input: a 'mtcnn_rnet' stage crops"
    ):
        load_chain(backend, load_config(path))
