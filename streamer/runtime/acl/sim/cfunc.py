"""C functions of a shared library, as ctypes calls them, for the simulated libraries.

A :class:`SimLibrary` stands where ``ctypes.CDLL("libacl_tdt_queue.so")`` would be: the
wrapper code sets ``argtypes`` / ``restype`` and calls the functions with the same ctypes
arguments (``byref``, arrays, ``c_char_p``). Each call is checked as a careful reviewer would:
the declared ``argtypes`` / ``restype`` must match the C header (a wrong declaration silently
truncates 64-bit pointers or sizes in a real process), arguments are converted by ctypes'
own ``from_param``, and a symbol the library does not export raises ``AttributeError`` like
``CDLL`` does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.sim.binding import Binder, Returns, SimError, SimulatorFault

__all__ = ["CFunction", "SimLibrary"]

_INTEGERS = (
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_long,
    ctypes.c_ulong,
    ctypes.c_int64,
    ctypes.c_uint64,
    ctypes.c_size_t,
)


class CFunction:
    """One exported C function.

    Args:
        name: the symbol, e.g. ``acltdtEnqueueData``.
        argtypes: the parameter types of the C header.
        restype: the return type of the C header.
        impl: the simulation; receives Python values (ints, bytes) or, for pointer
            parameters, the ctypes object the pointer refers to (to write through).
        binder: call log and error handling.
    """

    def __init__(
        self,
        name: str,
        argtypes: Sequence[Any],
        restype: Any,
        impl: Callable[..., int],
        binder: Binder,
    ) -> None:
        self.__name__ = name
        self.argtypes: Sequence[Any] | None = None
        self.restype: Any = ctypes.c_int
        self._header = (tuple(argtypes), restype)
        self._impl = impl
        self._binder = binder
        binder.names.append(name)

    def __call__(self, *args: Any) -> Any:
        try:
            values = self._check(args)
            returns: Returns = "handle" if self.restype is ctypes.c_void_p else "ret"
            impl = self._null_pointer(args) or self._impl
            result = self._binder.invoke(self.__name__, returns, impl, values)
        except Exception as exc:
            self._binder.log.record(self.__name__, args, f"raised {type(exc).__name__}")
            raise
        self._binder.log.record(self.__name__, values, result)
        if self.restype is ctypes.c_void_p:
            return result or None
        return result

    def _null_pointer(self, args: tuple[Any, ...]) -> Callable[..., int] | None:
        """A stand-in that refuses the call when a typed pointer parameter (an out-parameter
        such as ``uint32_t *qid`` or ``size_t *retDataSize``, or a queue id array) is NULL:
        ACL checks them before doing anything and returns ``ACL_ERROR_INVALID_PARAM``."""
        assert self.argtypes is not None
        nulls = [
            position
            for position, (argtype, arg) in enumerate(zip(self.argtypes, args, strict=True), 1)
            if arg is None and issubclass(argtype, ctypes._Pointer)
        ]
        if not nulls:
            return None
        message = f"{self.__name__}: parameter {nulls[0]} is NULL"

        def refuse(*_args: Any) -> int:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "null-pointer", message)

        return refuse

    def _check(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """The declaration matches the header and the arguments convert, as ctypes would.

        Raises:
            SimulatorFault: ``argtypes`` / ``restype`` missing or not the header's.
            TypeError: wrong number of arguments; ctypes.ArgumentError: a wrong type.
        """
        if self.argtypes is None or (tuple(self.argtypes), self.restype) != self._header:
            raise SimulatorFault(
                f"{self.__name__}: declared argtypes={self.argtypes} restype={self.restype}, "
                f"header has {self._header}"
            )
        if len(args) != len(self.argtypes):
            raise TypeError(
                f"this function takes {len(self.argtypes)} arguments ({len(args)} given)"
            )
        return tuple(_convert(t, arg) for t, arg in zip(self.argtypes, args, strict=True))


_POINTER_VALUES = (ctypes.c_char_p, ctypes.c_wchar_p, ctypes.c_void_p)
"""ctypes objects that a ``void*`` parameter receives by value: the address they hold."""


def _convert(argtype: Any, arg: Any) -> Any:
    """The value the C function receives: for a ``byref`` argument the object it points to
    (so the simulation can write through it); for a ``void*`` the address, including that
    held by a ``c_char_p`` / ``c_void_p`` passed by value (a ``char*``, not a ``char**``)."""
    argtype.from_param(arg)
    if type(arg).__name__ == "CArgObject":
        return arg._obj
    if isinstance(arg, ctypes._Pointer) and arg:  # ctypes.pointer(x): the same as byref(x)
        return arg.contents
    if argtype in _INTEGERS:
        return argtype(arg).value if isinstance(arg, int) else arg.value
    if argtype is ctypes.c_void_p:
        if isinstance(arg, _POINTER_VALUES):
            return ctypes.cast(arg, ctypes.c_void_p).value or 0
        return arg or 0
    return arg


class SimLibrary:
    """A shared library exporting only the given functions.

    Args:
        name: the file name it stands for (``libacl_tdt_queue.so``).
        functions: its exported symbols.
    """

    def __init__(self, name: str, functions: Sequence[CFunction]) -> None:
        self._name = name
        self._functions = {function.__name__: function for function in functions}

    def __getattr__(self, symbol: str) -> CFunction:
        try:
            return self._functions[symbol]
        except KeyError:
            raise AttributeError(f"{self._name}: undefined symbol: {symbol}") from None
