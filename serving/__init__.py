"""tfhash.serving: the production path after the pipeline's Pusher and IndexBuilder.

* :mod:`.deployment` -- TF Serving artifacts (models.config, batching, monitoring, docker);
* :mod:`.model_server` -- development model server: TF Serving's gRPC API in process (a stand-in
  for ``tensorflow_model_server`` where it cannot run);
* :mod:`.client` -- ``ModelClient``, the encode client of TF Serving;
* :mod:`.searcher` -- version-locked model/index pairs, hot swap, request checks;
* :mod:`.search_service` / :mod:`.rest` -- the search service's gRPC and REST fronts;
* :mod:`.search_client` -- ``SearchClient``; :mod:`.cli` -- ``tfhash serve model|search|config``.

The gRPC modules ``search_pb2`` / ``search_pb2_grpc`` are generated from ``search.proto`` at build
time (``setup.py``).
"""
