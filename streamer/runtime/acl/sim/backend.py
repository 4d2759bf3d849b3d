"""``backend = "acl-sim"``: the ACL backend, unchanged, on a simulated Ascend machine.

The simulator is built from ``[runtime.options.sim]`` and injected where ``import acl`` and
the ctypes libraries would be. With ``device_count`` unset it simulates enough devices for
``runtime.devices``.

At close it logs what a run on a real device would have got wrong and no exit code shows: every
rule of the ACL docs a call broke (``acl_sim_rules_broken``, error) and every resource left
unreleased (``acl_sim_resources_left``, warning; none is expected unless a hung model was
abandoned, which leaves its memory to the process exit on purpose).
"""

from __future__ import annotations

import structlog

from streamer.config import RuntimeConfig
from streamer.errors import ConfigError
from streamer.runtime.acl.backend import AclBackend
from streamer.runtime.acl.options import SIM_MAX_DEVICES, parse_options
from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["AclSimBackend"]

RULES_LOGGED_MAX = 20
"""Broken rules listed in ``acl_sim_rules_broken`` at most (all are counted)."""
_log = structlog.get_logger(__name__)


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

    @classmethod
    def check_options(cls, config: RuntimeConfig) -> None:
        """Validate ``config.options`` as opening the backend would, the simulated machine's
        cross-checks included (its devices against ``runtime.devices``, the API names of
        ``fail_calls``), without opening it: a reload must not accept what the next start
        refuses.

        Raises:
            ConfigError: an option is unknown or invalid, named as ``runtime.options.<key>``.
        """
        cls._simulator(config)

    @staticmethod
    def _simulator(config: RuntimeConfig) -> Simulator:
        """The simulated machine ``config`` describes (nothing is opened yet).

        Raises:
            ConfigError: invalid options (``fail_calls`` naming an API the simulator lacks
                included), a device id beyond ``sim.device_count``, or a fault on a device
                ``runtime.devices`` does not list.
        """
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
        return Simulator(sim_options, device_count=needed)

    def __init__(self, config: RuntimeConfig) -> None:
        self.simulator = self._simulator(config)
        self._findings_logged = False
        super().__init__(
            config,
            acl=self.simulator.acl,
            tdt_library=self.simulator.tdt_library,
            acl_library=self.simulator.acl_library,
        )

    def close(self) -> None:
        """Close as :meth:`AclBackend.close` does, then log the broken rules and the resources
        left (module docstring). Idempotent: the findings are logged by the first call only
        (a daemon closes its pipeline as it stops, then again on its way out).

        Raises:
            AclError: a release failed (every release is still attempted).
            BackendError: a model was abandoned (its work did not finish).
        """
        try:
            super().close()
        finally:
            if not self._findings_logged:
                self._findings_logged = True
                self._log_findings()

    def _log_findings(self) -> None:
        violations = self.simulator.violations
        if violations:
            _log.error(
                "acl_sim_rules_broken",
                count=len(violations),
                violations=[
                    {"rule": v.rule, "api": v.api, "code": int(v.code), "message": v.message}
                    for v in violations[:RULES_LOGGED_MAX]
                ],
            )
        left = self.simulator.live_resources()
        if left and not self.abandoned_devices:
            _log.warning(
                "acl_sim_resources_left", resources={kind: len(v) for kind, v in left.items()}
            )
