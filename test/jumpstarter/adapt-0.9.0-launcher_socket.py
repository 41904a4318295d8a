"""Adaptation of jumpstarter 0.9.0 to the production ExporterConfig: drop the Qemu driver's `launcher_socket`.

The controller always sets `launcher_socket: /shared/launcher.sock`, the socket of the runtime container that starts
QEMU in upstream's later design. 0.9.0's Qemu dataclass has no such field and fails with "unexpected keyword argument
'launcher_socket'"; without it, 0.9.0 runs QEMU in the exporter's own container, which shares its network namespace
with the runtime, so the hostfwd on 127.0.0.1:2222 still lands where the tcp driver looks.

image.sh installs this file as a module in the image's venv together with a .pth file importing it, so it is active
in every interpreter there. It only wraps Qemu.__init__ once jumpstarter_driver_qemu.driver is imported; any other
module loads unchanged.
"""

import functools
import importlib.abc
import importlib.util
import logging
import sys

_TARGET = "jumpstarter_driver_qemu.driver"
_log = logging.getLogger("jumpstarter.adapt-0.9.0")


def _patch(cls):
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, launcher_socket=None, **kwargs):
        if launcher_socket is not None:
            _log.info("jumpstarter 0.9.0: ignoring launcher_socket=%s, QEMU runs in this container", launcher_socket)
        init(self, *args, **kwargs)

    cls.__init__ = __init__


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)  # one module to patch, and no recursion into this finder below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module.Qemu)

        spec.loader.exec_module = exec_and_patch
        return spec


if _TARGET in sys.modules:
    _patch(sys.modules[_TARGET].Qemu)
else:
    sys.meta_path.insert(0, _Finder())
