"""tfhash.serving: the production path after the pipeline's Pusher and IndexBuilder.

TF Serving's artifacts and a development model server that implements its gRPC API, the encode
and search clients, and the search service: version-locked model / index pairs behind one gRPC and
REST front (with the search page), on one port for one or several processes. ``docs/architecture.md``
maps its modules; ``search_pb2`` / ``search_pb2_grpc`` are generated from ``search.proto`` at build
time (``setup.py``).
"""

__all__: list[str] = []  # the modules of this package are imported by their names
