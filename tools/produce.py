"""Send frames from a video, an image folder, an image or a camera to a streamer daemon.

Usage::

    python tools/produce.py carphone.mp4 --fps 30
    python tools/produce.py ./frames --encoding raw --endpoint tcp://10.0.0.5:5555
    python tools/produce.py astronaut.png --loop 100 --source still
    python tools/produce.py 0 --source door-cam       # camera 0 until Ctrl-C
"""

from __future__ import annotations

from pathlib import Path

from streamer.entry import ctrl_c_aborts

with ctrl_c_aborts():  # the libraries load in about half a second (OpenCV, ZeroMQ)
    import click
    from tqdm import tqdm

    from streamer.clients import (
        DEFAULT_CLOSE_TIMEOUT_S,
        DEFAULT_FRAME_LIMITS,
        DEFAULT_PRODUCER_ENDPOINT,
        IMAGE_SUFFIXES,
        FrameLimits,
        MediaInput,
        open_input,
        produce,
    )
    from streamer.clients.pacer import MIN_FPS
    from streamer.clients.tool_options import (
        MAX_WAIT_S,
        curve_client,
        curve_options,
        finite,
        sigterm_as_ctrl_c,
        zmq_endpoint,
    )
    from streamer.errors import ClientError, StreamerError
    from streamer.transport.protocol import ENCODINGS


def _non_empty(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value == "":
        raise click.BadParameter("must not be empty")
    return value


def _media(_ctx: click.Context, _param: click.Parameter, spec: str) -> MediaInput:
    """INPUT resolved (:func:`open_input`): one that does not exist, or a folder without an
    image file (nothing to send), is a usage error, before anything connects."""
    try:
        media = open_input(spec)
    except StreamerError as exc:
        raise click.BadParameter(str(exc)) from exc
    if media.kind == "folder" and not media.frame_count():
        suffixes = ", ".join(IMAGE_SUFFIXES)
        raise click.BadParameter(f"folder {spec!r} has no image files ({suffixes}) to send")
    return media


def _pace(ctx: click.Context, param: click.Parameter, fps: float) -> float:
    """``--fps``: finite, and 0 or at least :data:`MIN_FPS` (a slower pace overflows the
    pacer's sleep)."""
    fps = finite(ctx, param, fps) or 0.0
    if 0 < fps < MIN_FPS:
        raise click.BadParameter(f"must be 0 or at least {MIN_FPS}, got {fps}")
    return fps


@click.command()
@click.argument("media", metavar="INPUT", callback=_media)
@click.option(
    "--endpoint",
    default=DEFAULT_PRODUCER_ENDPOINT,
    callback=zmq_endpoint,
    show_default=True,
    help="The daemon's PULL ingress.",
)
@click.option("--source", callback=_non_empty, help="Source id.  [default: the input's file stem]")
@click.option(
    "--fps",
    type=click.FloatRange(min=0),
    callback=_pace,
    default=0.0,
    show_default=True,
    help=f"Frames per second, 0 or at least {MIN_FPS}; 0 sends as fast as possible.",
)
@click.option("--limit", type=click.IntRange(min=0), help="Stop after this many frames.")
@click.option(
    "--loop",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Passes over the input, 0 for endless; a single image is sent N times.",
)
@click.option("--encoding", type=click.Choice(ENCODINGS), default="jpeg", show_default=True)
@click.option(
    "--quality", type=click.IntRange(0, 100), default=90, show_default=True, help="JPEG quality."
)
@click.option(
    "--send-timeout",
    "send_timeout_s",
    type=click.FloatRange(min=0, max=MAX_WAIT_S, min_open=True),
    callback=finite,
    default=5.0,
    show_default=True,
    help="Seconds to wait for the daemon to take a frame (or the end-of-stream) before "
    "giving up on it and the frames after it; the exit code is then 1.",
)
@click.option(
    "--close-timeout",
    "close_timeout_s",
    type=click.FloatRange(min=0, max=MAX_WAIT_S, min_open=True),
    callback=finite,
    default=DEFAULT_CLOSE_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait after the last frame for the queued frames and the end-of-stream "
    "to leave; frames still queued then are discarded and the exit code is 1.",
)
@click.option(
    "--no-size-limits",
    is_flag=True,
    help="Send frames over the daemon's default [[ingress]] size limits (max_width_px, "
    "max_height_px, max_pixels, max_message_bytes), to a daemon that raised them; "
    "otherwise such a frame ends the run before it is sent.",
)
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@curve_options
def main(
    media: MediaInput,
    endpoint: str,
    source: str | None,
    fps: float,
    limit: int | None,
    loop: int,
    encoding: str,
    quality: int,
    send_timeout_s: float,
    close_timeout_s: float,
    no_size_limits: bool,
    no_progress: bool,
    curve_server_key: Path | None,
    curve_secret_key: Path | None,
) -> None:
    """Send the frames of INPUT (a video, an image folder, an image, a fetched media name
    such as carphone.mp4, or a camera index) to a streamer daemon, then end-of-stream.
    SIGTERM stops it as Ctrl-C does."""
    curve = curve_client(curve_server_key, curve_secret_key)
    sigterm_as_ctrl_c()
    source = media.name if source is None else source
    total = _expected_frames(media, loop, limit)
    limits = FrameLimits.unlimited() if no_size_limits else DEFAULT_FRAME_LIMITS
    try:
        with tqdm(total=total, unit="frame", disable=no_progress) as bar:
            stats = produce(
                media,
                endpoint,
                source=source,
                fps=fps,
                limit=limit,
                loop=loop,
                encoding=encoding,
                quality=quality,
                send_timeout_s=send_timeout_s,
                close_timeout_s=close_timeout_s,
                on_sent=lambda _size: bar.update(),
                curve=curve,
                limits=limits,
            )
    except StreamerError as exc:
        raise click.ClickException(str(exc)) from exc
    except ValueError as exc:  # an argument produce() refuses before it connects
        raise click.UsageError(str(exc)) from exc
    rate = f" ({stats.fps:.1f} fps)" if stats.frames > 1 else ""  # a rate needs two frames
    click.echo(
        f"sent {stats.frames} frame{'' if stats.frames == 1 else 's'} "
        f"({stats.bytes_sent / 1e6:.2f} MB) as {source!r} to {endpoint} in "
        f"{stats.seconds:.2f} s{rate}"
    )


def _expected_frames(media: MediaInput, loop: int, limit: int | None) -> int | None:
    """Frames the run will send, for the progress bar; None when unknown or endless.

    Raises:
        click.BadParameter: INPUT is a video that cannot be opened (OpenCV's own message,
            e.g. ``moov atom not found``, comes just before), before anything connects.
    """
    try:
        count = media.frame_count()
    except ClientError as exc:
        raise click.BadParameter(str(exc), param_hint="'INPUT'") from exc
    if count is None or loop == 0:
        return limit
    return count * loop if limit is None else min(limit, count * loop)


if __name__ == "__main__":
    main()
