"""A Kubernetes API server emulator (in-memory, single event loop) for tests and the embedded default.

Public API: :class:`Emulator` (run in a loop), :class:`BackgroundEmulator` (run in a thread),
:class:`EmulatorControl` (client of the ``/_emulator/`` endpoint), :class:`FaultRule`.
"""

from .control import EmulatorControl
from .faults import FaultRule
from .server import BackgroundEmulator, Emulator, Settings, SettingsPatch, emulator_tls_material, kubeconfig_doc

__all__ = [
    "BackgroundEmulator",
    "Emulator",
    "EmulatorControl",
    "FaultRule",
    "Settings",
    "SettingsPatch",
    "emulator_tls_material",
    "kubeconfig_doc",
]
