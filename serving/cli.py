"""``tfhash serve model|search|config``."""

from __future__ import annotations

import functools
import json
import logging
import os

import click

from tfhash import storage
from tfhash.console import BadInput

__all__ = ["serve_group", "exported_image_root", "search"]


@click.group("serve")
def serve_group() -> None:
    """TF Serving artifacts, the development model server and the search service."""
    # A service's own events show by default: versions loaded and unloaded, the pair it serves.
    events = logging.getLogger("tfhash.serving")
    if events.getEffectiveLevel() > logging.INFO:
        events.setLevel(logging.INFO)


def _layout(config_path: str):
    """The :class:`tfhash.artifacts.RunLayout` of a pipeline config (its serving, index and data folders)."""
    from tfhash.artifacts import RunLayout

    try:
        return RunLayout.from_config_file(config_path)
    except ValueError as err:
        raise BadInput(str(err)) from err


def exported_image_root(items_file: str) -> str | None:
    """The folder ``tfhash data export-user`` read the images from, as the ``metadata.json`` beside
    ``items_file`` records it, when it still exists."""
    from tfhash.artifacts import read_data_description

    try:
        root = read_data_description(storage.parent(items_file)).get("image_root")
    except (OSError, ValueError, AttributeError):
        return None
    return root if isinstance(root, str) and os.path.isdir(root) else None


def access_options(command):
    """The options of who may ask a service (:class:`tfhash.serving.access.Access`), given to
    ``command`` as one ``access`` argument."""
    options = [
        click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), help="The server's certificate chain (PEM): every port speaks TLS only."),
        click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), help="The certificate's private key (PEM)."),
        click.option("--client-ca", type=click.Path(exists=True, dir_okay=False),
                     help="With TLS: accept only clients with a certificate this CA (PEM) signed."),
        click.option("--token-file", type=click.Path(exists=True, dir_okay=False),
                     help="Every request must carry 'authorization: Bearer <the file's token>' (health and readiness excepted)."),
        click.option("--allow-insecure", is_flag=True,
                     help="Bind beyond loopback without TLS or a token (refused otherwise): only on a network you trust."),
    ]  # fmt: skip

    @functools.wraps(command)
    def with_access(tls_cert, tls_key, client_ca, token_file, allow_insecure, **kwargs):
        from tfhash.serving.access import Access

        try:
            access = Access(tls_cert=tls_cert, tls_key=tls_key, client_ca=client_ca, token_file=token_file, allow_insecure=allow_insecure)
        except ValueError as err:
            raise click.UsageError(str(err)) from err
        return command(access=access, **kwargs)

    for option in reversed(options):
        with_access = option(with_access)
    return with_access


@serve_group.command("config")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="A pipeline config: serve what its Pusher wrote.")
@click.option("--base-path", help="A TF Serving model base directory (instead of --config).")
@click.option("--model-name", help="The model name (with --base-path).")
@click.option("--index-base-dir", help="Pin only versions whose index is published here (default with --config: its index folder).")
@click.option("--output", help="Folder for the artifacts (default: <run dir>/tf_serving with --config).")
@click.option("--num-versions", default=2, show_default=True, type=click.IntRange(1))
def config_(config_path, base_path, model_name, index_base_dir, output, num_versions) -> None:
    """Write models.config (newest paired versions pinned), batching and monitoring configs and a
    docker run / compose example. Run it again after publishing a version."""
    import os

    from tfhash.serving.deployment import write_deployment

    if config_path:
        layout = _layout(config_path)
        model_name, base_path, indexes, tf_serving = layout.name, layout.serving, layout.indexes, layout.tf_serving
        output, index_base_dir = output or tf_serving, index_base_dir or indexes
    elif not (base_path and model_name and output):
        raise click.UsageError("pass --config, or --base-path with --model-name and --output")
    try:
        summary = write_deployment(base_path, model_name, output, num_versions=num_versions, index_base_dir=index_base_dir)
    except ValueError as err:
        raise BadInput(str(err)) from err
    click.echo(json.dumps({**summary, "output": output if storage.is_uri(output) else os.path.abspath(output)}, indent=2))


@serve_group.command("model")
@click.option("--model-config-file", help="A models.config text proto (a file or a URI).")
@click.option("--model-name", help="Serve one model (instead of --model-config-file) ...")
@click.option("--model-base-path", help="... from this base directory (latest version).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (loopback by default).")
@click.option("--port", default=8500, show_default=True, type=click.IntRange(0, 65535))
@click.option("--poll-seconds", default=1.0, show_default=True, type=click.FloatRange(0.1))
@click.option("--config-poll-seconds", default=10.0, show_default=True, type=click.FloatRange(0),
              help="Re-read --model-config-file when it changes, looking this often (0: read once).")
@click.option("--reload-api", is_flag=True,
              help="Answer HandleReloadConfigRequest (off by default: any client could replace the models served).")
@click.option("--allowed-model-root", type=click.Path(file_okay=False),
              help="With --reload-api: HandleReloadConfigRequest may only name base paths under this folder (default: any).")
@click.option("--max-request-mb", default=64, show_default=True, type=click.IntRange(1))
@click.option("--grace-seconds", default=10.0, show_default=True, type=click.FloatRange(0),
              help="On SIGTERM / Ctrl-C, how long in-flight requests may take to finish.")
@access_options
def model(model_config_file, model_name, model_base_path, host, port, poll_seconds, config_poll_seconds, reload_api, allowed_model_root,
          max_request_mb, grace_seconds, access) -> None:  # fmt: skip
    """Run the development model server (TF Serving's gRPC API, in process) until Ctrl-C / SIGTERM.

    A stand-in for tensorflow_model_server where it cannot run; use the official server in production.
    """
    from tfhash.serving.deployment import model_config, models_config, read_models_config
    from tfhash.serving.errors import ServingError
    from tfhash.serving.grpc_server import EXIT_SECONDS, run_until_signal
    from tfhash.serving.model_server import DevModelServer

    if allowed_model_root and not reload_api:
        raise click.UsageError("--allowed-model-root confines the reload API: pass --reload-api too")
    if model_config_file:
        try:
            server_config = read_models_config(model_config_file)
        except ValueError as err:
            raise BadInput(str(err)) from err
    elif model_name and model_base_path:
        server_config = models_config([model_config(model_name, model_base_path, num_versions=1)])
    else:
        raise click.UsageError("pass --model-config-file, or --model-name with --model-base-path")
    try:
        server = DevModelServer(server_config, host=host, port=port, poll_seconds=poll_seconds, max_message_bytes=max_request_mb << 20,
                                config_file=model_config_file, config_poll_seconds=config_poll_seconds,
                                allowed_root=allowed_model_root, reload_api=reload_api, access=access)  # fmt: skip
    except ValueError as err:
        raise BadInput(str(err)) from err
    except (OSError, ServingError) as err:
        raise click.ClickException(str(err)) from err
    run_until_signal(server, grace_seconds, exit_within=EXIT_SECONDS, on_started=lambda s: click.echo(
        f"development model server on {s.address} (stand-in for tensorflow_model_server)", err=True))  # fmt: skip


@serve_group.command("search")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), help="A pipeline config: its serving and index folders.")
@click.option("--index-base-dir", help="Folder or URI (gs://, s3://) of <version>/<kind>/ indexes (instead of --config).")
@click.option("--model-base-dir", help="Folder or URI of the SavedModel versions: encode in process (or, with --model-server, "
              "check fingerprints).")
@click.option("--model-server", help="host:port of TF Serving (or `tfhash serve model`): encode there.")
@click.option("--model-name", help="The model's name on --model-server (default: the pipeline name).")
@click.option("--kind", default="BFlat", show_default=True,
              help="Which index of each version to serve (cross-modal models: <kind>-<database modality>).")
@click.option("--query-modality", default=None, help="Cross-modal models: the queries' modality (its tower encodes).")
@click.option("--items", "items_file", default=None,
              help="The data's items.csv (written by tfhash data export / export-user): answers name each hit's file and "
                   "classes (default with --config: the run's data folder's items.csv, when there is one).")
@click.option("--image-root", default=None, type=click.Path(exists=True, file_okay=False),
              help="The folder the indexed images were exported from: with --items and --rest-port, the REST port serves the "
                   "search page at / (default: the folder the items' metadata.json names, when it exists). See docs/serving.md.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (loopback by default).")
@click.option("--port", default=8600, show_default=True, type=click.IntRange(0, 65535))
@click.option("--rest-port", default=None, type=click.IntRange(0, 65535), help="Also serve REST/JSON here.")
@click.option("--max-k", default=1000, show_default=True, type=click.IntRange(1))
@click.option("--max-batch", default=256, show_default=True, type=click.IntRange(1))
@click.option("--max-request-mb", default=8, show_default=True, type=click.IntRange(1))
@click.option("--poll-seconds", default=2.0, show_default=True, type=click.FloatRange(0.1))
@click.option("--search-threads", "--faiss-threads", "search_threads", default=1, show_default=True, type=click.IntRange(1),
              help="Threads per index search (the exact kernel's and FAISS's); concurrency comes from --processes. "
                   "(--faiss-threads: the former name.)")
@click.option("--processes", default=1, show_default=True, type=click.IntRange(1),
              help="Serving processes on the one port (and REST port), supervised by this one; each answers one joined "
                   "search at a time, so one a core. Needs a numeric --host. See docs/serving.md.")
@click.option("--tf-threads", default=0, show_default=True, type=click.IntRange(0),
              help="In-process encoding: TensorFlow's threads in each process (0: TensorFlow's default, the cores).")
@click.option("--rest-timeout", default=10.0, show_default=True, type=click.FloatRange(0.1),
              help="REST: seconds a client has to send its headers, and again its body, before the connection is closed.")
@click.option("--event-loop", default="auto", show_default=True,
              help="The loop that serves: uvloop (installed with the serving extra; less CPU per request), asyncio (the "
                   "standard library's), or auto: uvloop where it is installed.")
@click.option("--grace-seconds", default=10.0, show_default=True, type=click.FloatRange(0),
              help="On SIGTERM / Ctrl-C, how long in-flight requests may take to finish.")
@access_options
@click.option("--model-server-ca", type=click.Path(exists=True, dir_okay=False),
              help="Speak TLS to --model-server, trusting this CA (PEM).")
@click.option("--model-server-token-file", type=click.Path(exists=True, dir_okay=False),
              help="Send this file's bearer token to --model-server.")
def search(config_path, index_base_dir, model_base_dir, model_server, model_name, kind, query_modality, items_file, image_root, host,
           port, rest_port, max_k, max_batch, max_request_mb, poll_seconds, search_threads, processes, tf_threads,
           rest_timeout, event_loop, grace_seconds, access, model_server_ca, model_server_token_file) -> None:  # fmt: skip
    """Run the search service until Ctrl-C / SIGTERM (then drain in-flight requests)."""
    from tfhash.serving.access import ClientCredentials
    from tfhash.serving.event_loop import new_event_loop
    from tfhash.serving.grpc_server import EXIT_SECONDS, BindError, run_until_signal
    from tfhash.serving.processes import ProcessFront, SearchOptions, ServiceFailed, build_server

    from tfhash.artifacts import ITEMS_FILE, read_items

    if config_path:
        layout = _layout(config_path)
        model_name, model_base_dir, index_base_dir = model_name or layout.name, model_base_dir or layout.serving, index_base_dir or layout.indexes
        found = storage.join(layout.data, ITEMS_FILE)
        items_file = items_file or (found if storage.isfile(found) else None)
    try:
        for location in (items_file, index_base_dir, model_base_dir):
            storage.check_scheme(location)
        items = read_items(items_file) if items_file else None  # refused here, before any process starts
    except (OSError, ValueError) as err:
        raise BadInput(str(err)) from err
    if image_root and not items:
        raise click.UsageError("--image-root shows the items of --items: pass the data's items.csv too (or --config)")
    if items and rest_port is not None and not image_root:
        image_root = exported_image_root(items_file)
    if not index_base_dir or not (model_base_dir or model_server):
        raise click.UsageError("pass --config, or --index-base-dir with --model-base-dir and/or --model-server")
    if (model_server_ca or model_server_token_file) and not model_server:
        raise click.UsageError("--model-server-ca and --model-server-token-file are for --model-server")
    if model_server and not model_name:
        raise click.UsageError("--model-server needs --model-name")
    try:
        new_event_loop(event_loop).close()  # refused here, before any process starts
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--event-loop") from err
    options = SearchOptions(index_base_dir=index_base_dir, kind=kind, model_base_dir=model_base_dir, model_server=model_server,
                            model_name=model_name, query_modality=query_modality, items_file=items_file, image_root=image_root,
                            host=host, port=port, rest_port=rest_port, max_k=max_k, max_batch=max_batch,
                            max_request_mb=max_request_mb, poll_seconds=poll_seconds, search_threads=search_threads,
                            tf_threads=tf_threads, rest_timeout=rest_timeout, event_loop=event_loop, access=access,
                            model_server_credentials=ClientCredentials(ca_file=model_server_ca, token_file=model_server_token_file))  # fmt: skip
    try:
        server = ProcessFront(options, processes, grace_seconds) if processes > 1 else build_server(options)
    except ValueError as err:
        raise BadInput(str(err)) from err

    def started(server) -> None:
        status = server.status()
        click.echo(f"search service on {server.address}" + (f", REST on {host}:{server.rest_port}" if server.rest_port is not None else "")
                   + (f" ({processes} processes)" if processes > 1 else "")
                   + ("; serving model version " + ", ".join(sorted(set(status["process_versions"]))) if status["ready"]
                      else "; waiting for a model version with its index")
                   + (f"; answers name files and classes from {items_file}" if items else "")
                   + (f"; search page on {'https' if access.tls else 'http'}://{host}:{server.rest_port}/ (images under {image_root})"
                      if image_root else "")
                   + ("; TLS" if access.tls else "") + ("; requests need the bearer token" if access.token_file else ""), err=True)  # fmt: skip

    try:
        run_until_signal(server, grace_seconds, on_started=started, exit_within=EXIT_SECONDS)
    except (ServiceFailed, BindError) as err:
        raise click.ClickException(str(err)) from err
    if getattr(server, "failure", None):
        raise click.ClickException(server.failure)
