"""cis's version, written once: the package's metadata (pyproject.toml) and every report of it read it here."""

__version__ = "0.1.0"
