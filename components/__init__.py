"""tfhash.components"""

__all__: list[str] = []  # the modules of this package are imported by their names
