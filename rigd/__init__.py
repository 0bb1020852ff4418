"""rigd: a self-hosted sandbox server that gives AI agents real machines."""

__version__ = "0.1.0"
