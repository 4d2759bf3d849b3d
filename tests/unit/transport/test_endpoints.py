import pytest
import zmq

from streamer.errors import ConfigError
from streamer.transport.endpoints import EGRESS_TYPES, INGRESS_TYPES, parse_endpoint


def test_parse_bind_and_connect() -> None:
    endpoint = parse_endpoint("pull+bind:tcp://127.0.0.1:5555", INGRESS_TYPES, "ingress[0].uri")
    assert (endpoint.kind, endpoint.bind, endpoint.address) == ("pull", True, "tcp://127.0.0.1:5555")
    assert endpoint.socket_type == zmq.PULL
    assert str(endpoint) == "pull+bind:tcp://127.0.0.1:5555"
    endpoint = parse_endpoint("pub+connect:ipc:///tmp/results", EGRESS_TYPES, "egress[0].uri")
    assert not endpoint.bind and endpoint.socket_type == zmq.PUB


@pytest.mark.parametrize(
    "uri", ["tcp://127.0.0.1:5555", "pull:tcp://x:1", "pull+listen:tcp://x:1", "pull+bind:udp://x:1"]
)
def test_malformed(uri: str) -> None:
    with pytest.raises(ConfigError, match=r"ingress\[0\].uri"):
        parse_endpoint(uri, INGRESS_TYPES, "ingress[0].uri")


def test_type_not_allowed_here() -> None:
    with pytest.raises(ConfigError, match="not allowed"):
        parse_endpoint("pub+bind:tcp://127.0.0.1:1", INGRESS_TYPES, "ingress[0].uri")
