"""Encode a split of raw tf.Examples with an exported tfhash SavedModel: in one process
(:func:`encode_split`), or as a Beam job writing code shards (:class:`EncodeToShards`, on the
pipeline's Beam runner, so the database side scales out with it).

Both encoders run the model on the same batches (each record file from its start, ``batch_size``
records at a time), so their codes are bit-identical."""

from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam
import numpy as np
import tensorflow as tf
from apache_beam.ml.inference.base import ModelHandler, RunInference
from tfhash.components.code_shards import (
    MANIFEST,
    PART_RECORDS,
    CodeShards,
    CodeShardsError,
    write_manifest,
    write_shard,
)

from tfhash import storage
from tfhash.artifacts import (
    CODES,
    EXAMPLES_INPUT,
    EXAMPLES_SIGNATURE,
    ID,
    LABELS,
    PACKED_CODES,
    label_spec,
    signature_fingerprint,
)
from tfhash.index.refine import quantised_rows

__all__ = ["split_files", "encode_split", "shards_dir", "EncodeToShards", "ShardJob", "run_shard_jobs", "encode_to_shards"]


#: Records per model call.
BATCH_SIZE = 1024


def split_files(examples_uri: str, split: str) -> list[str]:
    """The record files of one split of an Examples artifact (``Split-<name>/``)."""
    files = storage.glob(storage.join(examples_uri, f"Split-{split}", "*"))
    if not files:
        raise FileNotFoundError(f"no records for split {split!r} under {examples_uri}")
    return files


def encode_batch(serve, records, num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Packed codes uint8 ``(n, K/8)``, multi-hot labels uint8 ``(n, C)``, ids int64 ``(n,)`` and
    embeddings int8 ``(n, K)`` (the continuous codes in 8 bits,
    :func:`tfhash.index.refine.quantised_rows`) of a batch of serialized records, encoded by the
    signature function ``serve``."""
    outputs = serve(**{EXAMPLES_INPUT: records})
    codes, embeddings = outputs[PACKED_CODES].numpy(), quantised_rows(outputs[CODES].numpy())
    parsed = tf.io.parse_example(records, label_spec())
    dense = tf.sparse.to_dense(parsed[LABELS], default_value=-1).numpy()
    multi_hot = np.zeros((dense.shape[0], num_classes), dtype=np.uint8)
    rows, cols = np.nonzero(dense >= 0)
    multi_hot[rows, dense[rows, cols]] = 1
    return codes, multi_hot, parsed[ID].numpy()[:, 0], embeddings


def file_batches(path: str, batch_size: int):
    """The serialized records of one record file, ``batch_size`` at a time, in file order. Both
    encoders batch each file from its start, so they run the model on the same batches."""
    return tf.data.TFRecordDataset(path, compression_type="GZIP").batch(batch_size)


def encode_split(saved_model_dir: str, files: list[str], num_classes: int, batch_size: int = BATCH_SIZE,
                 signature: str = EXAMPLES_SIGNATURE):  # fmt: skip
    """Packed codes, multi-hot labels, ids and embeddings of every example in ``files``, encoded by
    ``signature`` (``serving_<modality>`` picks one tower of a cross-modal model) in one process.

    Returns:
        ``(packed uint8 (n, K/8), labels uint8 (n, C), ids int64 (n,), embeddings int8 (n, K))``.
    """
    serve = tf.saved_model.load(saved_model_dir).signatures[signature]
    parts = [encode_batch(serve, batch, num_classes) for path in files for batch in file_batches(path, batch_size)]
    if not parts:
        raise ValueError(f"the record files {files} hold no records to encode")
    return tuple(np.concatenate([part[i] for part in parts]) for i in range(4))


def shards_dir(cache_dir: str, saved_model_dir: str, files: list[str], num_classes: int, signature: str = EXAMPLES_SIGNATURE) -> str:
    """Where :class:`EncodeToShards` keeps a split's codes under ``cache_dir``: a key of the
    signature, the record files, the SavedModel's fingerprint and the classes, so a model of the
    same fingerprint (the Pusher's copy of the evaluated model) finds them and any other misses."""
    import hashlib
    import json

    key = json.dumps([signature, sorted(files), signature_fingerprint(saved_model_dir), num_classes])
    return storage.join(cache_dir, f"shards-{hashlib.sha256(key.encode()).hexdigest()[:32]}")


class _ReadParts(beam.DoFn):
    """``(file number, path)`` -> ``((file number, part), path, first record, serialized records)``
    per ``part_records`` records of the file, in order."""

    def __init__(self, part_records: int):
        self.part_records = part_records

    def process(self, element):
        source, path = element
        for part, records in enumerate(file_batches(path, self.part_records)):
            yield (source, part), path, part * self.part_records, records.numpy()


class ShardEncoder(ModelHandler):
    """Beam ``RunInference``'s model handler for :class:`EncodeToShards`: loads the SavedModel once
    per worker process (after checking its fingerprint; with ``tf_threads``, TF's thread pools of
    that size first, unless TF already runs in the process, as with the in-memory runner) and
    encodes one part of a record file per call, ``batch_size`` records at a time, into
    ``(codes, labels, ids, embeddings)``."""

    def __init__(self, saved_model_dir: str, signature: str, num_classes: int, batch_size: int, fingerprint: str,
                 tf_threads: int | None = None):  # fmt: skip
        super().__init__()
        self.saved_model_dir, self.signature, self.num_classes = saved_model_dir, signature, num_classes
        self.batch_size, self.fingerprint, self.tf_threads = batch_size, fingerprint, tf_threads

    def load_model(self):
        if self.tf_threads:  # Beam sets this DoFn up before the reading one: TF's first use in a worker
            try:
                tf.config.threading.set_intra_op_parallelism_threads(self.tf_threads)
                tf.config.threading.set_inter_op_parallelism_threads(self.tf_threads)
            except RuntimeError:  # TF already initialised in this process (the in-memory runner)
                pass
        found = signature_fingerprint(self.saved_model_dir)
        if found != self.fingerprint:
            raise ValueError(f"{self.saved_model_dir}: the SavedModel changed while the job ran (fingerprint {found!r}, the job "
                             f"was built for {self.fingerprint!r}); run the job again")  # fmt: skip
        model = tf.saved_model.load(self.saved_model_dir)
        if self.signature not in model.signatures:
            raise ValueError(f"{self.saved_model_dir} has no signature {self.signature!r}; it has {sorted(model.signatures)}")
        return model

    def batch_elements_kwargs(self):
        return {"max_batch_size": 1}  # an element is already a part of many records

    def get_num_bytes(self, batch) -> int:
        """The records' bytes (Beam's default pickles the whole batch to measure it)."""
        return sum(len(record) for _, _, _, records in batch for record in records)

    def run_inference(self, batch, model, inference_args=None):
        serve, results = model.signatures[self.signature], []
        for key, path, first, records in batch:
            try:
                arrays = [encode_batch(serve, records[start:start + self.batch_size], self.num_classes)
                          for start in range(0, len(records), self.batch_size)]  # fmt: skip
            except (tf.errors.OpError, ValueError, IndexError) as err:  # IndexError: a label >= num_classes
                reason = (str(err).splitlines() or [type(err).__name__])[0]
                raise ValueError(f"record file {path}, records {first}-{first + len(records) - 1}: a record failed to encode: "
                                 f"{reason}") from err  # fmt: skip
            results.append((key, tuple(np.concatenate([a[i] for a in arrays]) for i in range(4))))
        return results


class EncodeToShards(beam.PTransform):
    """Beam job: the records of ``files`` encoded by ``signature`` of the SavedModel into code
    shards in ``directory`` (:mod:`tfhash.components.code_shards`), one shard per ``part_records``
    records of each file. Apply it to a pipeline (``pipeline | EncodeToShards(...)``); the
    manifest is written when every shard is in.

    The files are spread over the workers (so a split's record files bound the parallelism:
    ExampleGen on a distributed runner writes several); each worker reads its file's parts in
    order and hands them to Beam's ``RunInference`` (:class:`ShardEncoder`: the model loaded once
    per worker process, checked against the fingerprint taken when the job was built), which
    encodes ``batch_size`` records per call; a retried part rewrites its own shard, never a second
    copy.

    Raises (when the pipeline runs):
        ValueError: a record that fails to encode (the message names its file and records), a
            model whose fingerprint changed since the job was built.
        CodeShardsError: a split without records.
    """

    def __init__(self, saved_model_dir: str, files: list[str], num_classes: int, directory: str,
                 signature: str = EXAMPLES_SIGNATURE, batch_size: int = BATCH_SIZE, part_records: int = PART_RECORDS,
                 tf_threads: int | None = None):  # fmt: skip
        super().__init__()
        if not (batch_size >= 1 and part_records >= batch_size and part_records % batch_size == 0):
            raise ValueError(f"part_records ({part_records}) must be a positive multiple of batch_size ({batch_size}), so that "
                             "both encoders run the model on the same batches")  # fmt: skip
        self.files, self.directory, self.part_records = sorted(files), directory, part_records
        self.handler = ShardEncoder(saved_model_dir, signature, num_classes, batch_size, signature_fingerprint(saved_model_dir),
                                    tf_threads)  # fmt: skip

    def expand(self, pipeline):
        handler, directory, files = self.handler, self.directory, self.files
        storage.makedirs(directory)
        spec = {"sources": files, "signature": handler.signature, "fingerprint": handler.fingerprint,
                "num_classes": handler.num_classes, "part_records": self.part_records}  # fmt: skip
        return (pipeline
                | "Files" >> beam.Create(list(enumerate(files)))
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(_ReadParts(self.part_records))
                | "Encode" >> RunInference(handler)
                | "Write" >> beam.MapTuple(lambda key, arrays: write_shard(directory, *key, *arrays))
                | "All" >> beam.combiners.ToList()
                | "Manifest" >> beam.Map(lambda entries: write_manifest(directory, entries, **spec)))  # fmt: skip


@dataclass(frozen=True)
class ShardJob:
    """One split to encode into code shards: the records ``files``, the model and its
    ``signature``, and the ``directory`` the shards go to (:func:`shards_dir` for a cache)."""

    saved_model_dir: str
    files: tuple[str, ...]
    num_classes: int
    directory: str
    signature: str = EXAMPLES_SIGNATURE

    def done(self) -> CodeShards | None:
        """The shards when a finished job of this very job (model fingerprint, signature, record
        files, classes) is in :attr:`directory`, every shard intact; else ``None``."""
        try:
            shards = CodeShards.open(self.directory, signature_fingerprint(self.saved_model_dir), self.num_classes)
            if (shards.manifest["signature"], shards.manifest["sources"]) != (self.signature, sorted(self.files)):
                return None
            shards.verify()
        except CodeShardsError:
            return None
        return shards


def run_shard_jobs(pipeline: beam.Pipeline, jobs: list[ShardJob], **options) -> list[CodeShards]:
    """Encode every job not already done in ``pipeline`` (one Beam run for all; ``options`` as
    :class:`EncodeToShards` takes them) and return each job's checked shards, in order. A job whose
    directory holds the same finished job (:meth:`ShardJob.done`) is read back, not encoded again;
    any other manifest there is removed first, so that only the new run can finish the directory."""
    found = [job.done() for job in jobs]
    pending = [(number, job) for number, job in enumerate(jobs) if found[number] is None]
    if pending:
        for _, job in pending:
            storage.remove(storage.join(job.directory, MANIFEST))
        with pipeline as running:
            for number, job in pending:
                _ = running | f"Encode{number}" >> EncodeToShards(job.saved_model_dir, list(job.files), job.num_classes,
                                                                  job.directory, job.signature, **options)  # fmt: skip
    return [shards if shards is not None else CodeShards.open(job.directory, signature_fingerprint(job.saved_model_dir), job.num_classes)
            for job, shards in zip(jobs, found, strict=True)]  # fmt: skip


def encode_to_shards(saved_model_dir: str, files: list[str], num_classes: int, directory: str, beam_pipeline_args=(),
                     signature: str = EXAMPLES_SIGNATURE, **options) -> CodeShards:  # fmt: skip
    """:func:`run_shard_jobs` of one job on a Beam pipeline of its own, built from
    ``beam_pipeline_args`` (default: the direct runner in memory)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    job = ShardJob(saved_model_dir, tuple(files), num_classes, directory, signature)
    return run_shard_jobs(beam.Pipeline(options=PipelineOptions(list(beam_pipeline_args))), [job], **options)[0]
