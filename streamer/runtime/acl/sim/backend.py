"""``backend = "acl-sim"``: the ACL backend, unchanged, on a simulated Ascend machine.

The simulator is built from ``[runtime.options.sim]`` and injected where ``import acl`` and
the ctypes libraries would be. With ``device_count`` unset it simulates enough devices for
``runtime.devices``.
"""

from __future__ import annotations

from streamer.config import RuntimeConfig
from streamer.errors import ConfigError
from streamer.runtime.acl.backend import AclBackend
from streamer.runtime.acl.options import SIM_MAX_DEVICES, parse_options
from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["AclSimBackend"]


class AclSimBackend(AclBackend):
    """:class:`~streamer.runtime.acl.backend.AclBackend` on a :class:`Simulator`.

    Args:
        config: ``[runtime]``; ``options.sim`` configures the simulated machine.

    Attributes:
        simulator: the machine (call log, violations, leaks), for tests and debugging.

    Raises:
        ConfigError: invalid options, or a device id beyond ``sim.device_count``.
        BackendError: a start-up call failed.
    """

    name = "acl-sim"
    _simulated = True

    def __init__(self, config: RuntimeConfig) -> None:
        options = parse_options(config.options, simulated=True)
        sim_options = options.sim
        assert sim_options is not None, "parse_options(simulated=True) fills it"
        needed = max(config.devices, default=0) + 1
        if needed > SIM_MAX_DEVICES:
            raise ConfigError(
                f"runtime.devices: device {needed - 1}, but the simulator has at most "
                f"{SIM_MAX_DEVICES} devices (ids 0..{SIM_MAX_DEVICES - 1})"
            )
        unused = sorted(set(sim_options.device_lost_after_n_executes) - set(config.devices))
        if unused:
            raise ConfigError(
                f"runtime.options.sim.device_lost_after_n_executes: devices {unused} are not "
                f"in runtime.devices {list(config.devices)}"
            )
        if sim_options.device_count is not None and sim_options.device_count < needed:
            raise ConfigError(
                f"runtime.options.sim.device_count: {sim_options.device_count} devices, but "
                f"runtime.devices uses device {needed - 1}"
            )
        self.simulator = Simulator(sim_options, device_count=needed)
        super().__init__(
            config,
            acl=self.simulator.acl,
            tdt_library=self.simulator.tdt_library,
            acl_library=self.simulator.acl_library,
        )
