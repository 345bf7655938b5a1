"""The package version: its own module, at the bottom of the layers, so that reports and
baselines can stamp it without importing the package root (which imports them)."""

__version__ = "0.1.0"
