"""tfhash.serving: the production path after the pipeline's Pusher and IndexBuilder.

* :mod:`.deployment` -- TF Serving artifacts (models.config pinning the paired versions, batching,
  monitoring, docker);
* :mod:`.model_server` -- development model server: TF Serving's gRPC API in process (a stand-in
  for ``tensorflow_model_server`` where it cannot run);
* :mod:`.client` -- ``ModelClient``, the encode client of TF Serving;
* :mod:`.requests` -- what a request may hold, checked where it enters;
* :mod:`.versions` -- model versions, version policies, pairing checks and load retries;
* :mod:`.searcher` -- version-locked model/index pairs, converging hot swap, search;
* :mod:`.search_service` -- the search service's one front: gRPC (asyncio) and, with
  :mod:`.rest`, REST on one event loop; :mod:`.batching` -- the coalescer that joins concurrent
  searches of one kind; :mod:`.health` -- what its health service reports;
  :mod:`.grpc_server` -- the development model server's gRPC shell and every server's signal loop;
* :mod:`.processes` -- one search-service process, or several on one port under a supervising
  parent; :mod:`.siblings` -- what each of those processes serves, shared for health and status;
* :mod:`.search_client` -- ``SearchClient``; :mod:`.cli` -- ``tfhash serve model|search|config``.

The gRPC modules ``search_pb2`` / ``search_pb2_grpc`` are generated from ``search.proto`` at build
time (``setup.py``).
"""
