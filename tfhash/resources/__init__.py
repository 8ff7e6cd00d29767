"""Data files shipped with tfhash (see scripts/build_codetable.py for their source)."""
