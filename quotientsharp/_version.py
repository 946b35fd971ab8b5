"""The package's release, in a module of its own: a module inside the package reads it without
importing the package's top (``workflows.records`` stamps it on every run)."""

__version__ = "0.3.0"
