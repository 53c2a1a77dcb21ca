"""Metering: the ``Meter`` interface, its in-process default, ``MeteredCheckpointer`` and the adapters."""

from threadloom.persistence.metrics.meter import InMemoryMeter, Meter
from threadloom.persistence.metrics.metered import MeteredCheckpointer

__all__ = ["InMemoryMeter", "Meter", "MeteredCheckpointer"]
