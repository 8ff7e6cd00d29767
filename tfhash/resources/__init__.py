"""Data files shipped with tfhash (see scripts/build_codetable.py for their source)."""

__all__: list[str] = []  # the modules of this package are imported by their names
