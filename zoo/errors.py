"""Errors the zoo raises, as types a caller (the CLI above all) can tell apart.

`ZooUsageError` and its subclasses mean the request was wrong (unknown pattern, bad shape
string, a dtype the zoo does not know): the CLI turns them into a one-line message and exit
status 2. `EntryError` means a plugin built an `Entry` that breaks the registry's contract.
"""

from __future__ import annotations


class ZooError(Exception):
    """Base class of every error the zoo raises on purpose."""


class ZooUsageError(ZooError, ValueError):
    """The request itself is wrong; the message says what to pass instead."""


class UnknownPattern(ZooUsageError):
    """A pattern name that no entry implements and the zoo does not define."""


class UnknownActivation(ZooUsageError):
    """An activation name outside gelu, gelu_tanh, relu, silu, none."""


class UnknownDtype(ZooUsageError):
    """A dtype name the check harness has no error bound for."""


class BadShape(ZooUsageError):
    """A shape string or tuple that is not M,K,N positive integers."""


class UnknownEntry(ZooUsageError):
    """An entry name that discovery did not find."""


class DeviceUnavailable(ZooUsageError):
    """A device this machine does not have (``cuda`` without a GPU)."""


class EntryError(ZooError, TypeError):
    """An `Entry` whose fields break the registry's contract (bad pattern, activation...)."""
