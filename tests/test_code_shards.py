"""The database side as a Beam job: code shards equal the in-process encoder's codes, and a bad
record, a corrupt or foreign shard and a failed attempt are refused or repaired, never merged."""

from __future__ import annotations

import os
import shutil

import apache_beam as beam
import numpy as np
import pytest
import tensorflow as tf
from apache_beam.options.pipeline_options import PipelineOptions
from tfhash.components import encoding
from tfhash.components.code_shards import MANIFEST, CodeShards, CodeShardsError, shard_name
from tfhash.components.index_builder import fill_index

from tests.serving_fixtures import database, export_version, vector_example
from tfhash.index import index_factory
from tfhash.metrics import evaluate_retrieval, evaluate_retrieval_sharded

IN_MEMORY = ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
TWO_PROCESSES = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
#: Small batches and parts, so that files split into several parts and the last one is short.
SMALL = {"batch_size": 64, "part_records": 128}


def write_records(path: str, vectors: np.ndarray, ids: np.ndarray, bad_at: int | None = None) -> str:
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for i, (row, item) in enumerate(zip(vectors, ids, strict=True)):
            writer.write(b"not a tf.Example" if i == bad_at else vector_example(row, label=int(item) % 3, item_id=int(item)))
    return path


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """Three record files of 300, 0 and 170 records, and a model."""
    root = tmp_path_factory.mktemp("split")
    vectors, ids = database(n=470)
    files = [write_records(str(root / "b.gz"), vectors[:300], ids[:300]), write_records(str(root / "c.gz"), vectors[:0], ids[:0]),
             write_records(str(root / "a.gz"), vectors[300:], ids[300:])]  # fmt: skip
    return files, export_version(str(root / "models"), 1, seed=0), export_version(str(root / "models"), 2, seed=5)


@pytest.mark.parametrize("args", [IN_MEMORY, pytest.param(TWO_PROCESSES, marks=pytest.mark.process)], ids=["in-memory", "two-processes"])
@pytest.mark.beam
def test_shards_hold_the_in_process_codes_in_record_order(split, tmp_path, args):
    files, model, _ = split
    codes, labels, ids, embeddings = encoding.encode_split(model, sorted(files), 3, batch_size=SMALL["batch_size"])
    shards = encoding.encode_to_shards(model, files, 3, str(tmp_path / "shards"), args, **SMALL)
    names = [entry["name"] for entry in shards.manifest["shards"]]
    # files in sorted order: a.gz (170 records: parts of 128 and 42), b.gz (300: 128, 128, 44), c.gz (none)
    assert names == [shard_name(0, 0), shard_name(0, 1), shard_name(1, 0), shard_name(1, 1), shard_name(1, 2)]
    assert [entry["count"] for entry in shards.manifest["shards"]] == [128, 42, 128, 128, 44] and len(shards) == 470
    got = [np.concatenate(arrays) for arrays in zip(*shards, strict=True)]
    for a, b in zip(got, (codes, labels, ids), strict=True):
        np.testing.assert_array_equal(a, b)  # bit-identical, same order
    packed, all_ids = shards.codes_and_ids()
    np.testing.assert_array_equal(packed, codes)
    np.testing.assert_array_equal(all_ids, ids)
    stored = shards.embeddings()  # the second stage's rows: by id, the in-process encoder's, in 8 bits
    order = np.argsort(ids)
    np.testing.assert_array_equal(stored.ids, ids[order])
    np.testing.assert_array_equal(stored.rows, embeddings[order])
    assert stored.rows.dtype == np.int8 and np.all(np.abs(stored.rows.astype(np.int16)).max(axis=1) == 127)
    assert sorted(os.listdir(tmp_path / "shards")) == sorted([*names, MANIFEST])  # nothing else left behind
    # the streamed evaluation is the in-memory one
    expected = evaluate_retrieval(codes[:50], codes, labels[:50], labels, tie_aware=True)
    streamed = evaluate_retrieval_sharded(codes[:50], labels[:50], lambda: ((c, y) for c, y, _ in shards), tie_aware=True)
    assert streamed.mean_average_precision() == expected.mean_average_precision()


@pytest.mark.beam
def test_a_corrupt_or_foreign_or_unfinished_shard_directory_is_refused(split, tmp_path):
    files, model, other = split
    directory = str(tmp_path / "shards")
    shards = encoding.encode_to_shards(model, files, 3, directory, IN_MEMORY, **SMALL)
    with pytest.raises(CodeShardsError, match="encoded by the SavedModel with fingerprint .*encode the split again"):
        CodeShards.open(directory, expected_fingerprint=encoding.signature_fingerprint(other))
    with pytest.raises(CodeShardsError, match="the shards hold 3 classes, not 5"):
        CodeShards.open(directory, num_classes=5)
    first = os.path.join(directory, shards.manifest["shards"][0]["name"])
    data = bytearray(open(first, "rb").read())
    data[-20] ^= 0xFF
    open(first, "wb").write(bytes(data))
    with pytest.raises(CodeShardsError, match="checksum mismatch"):
        list(CodeShards.open(directory))
    job = encoding.ShardJob(model, tuple(files), 3, directory)
    assert job.done() is None  # a damaged job is not reused: it is encoded again
    healed = encoding.run_shard_jobs(beam.Pipeline(options=PipelineOptions(IN_MEMORY)), [job], **SMALL)[0]
    assert healed.manifest["shards"] == shards.manifest["shards"]  # the same bytes again: shards carry no time stamp
    os.remove(first)
    with pytest.raises(CodeShardsError, match="cannot be read"):
        list(CodeShards.open(directory))
    os.remove(os.path.join(directory, MANIFEST))
    with pytest.raises(CodeShardsError, match="no manifest.json; the encoding job did not finish"):
        CodeShards.open(directory)


@pytest.mark.beam
@pytest.mark.process  # the rerun runs on two worker processes
def test_a_bad_record_fails_the_job_by_name_and_a_rerun_writes_every_id_once(split, tmp_path):
    files, model, _ = split
    vectors, ids = database(n=300)
    broken = write_records(str(tmp_path / "b.gz"), vectors, ids, bad_at=200)
    directory = str(tmp_path / "shards")
    with pytest.raises(Exception, match=r"record file .*b\.gz, records 128-255: a record failed to encode"):
        encoding.encode_to_shards(model, [files[2], broken], 3, directory, IN_MEMORY, **SMALL)
    assert not os.path.exists(os.path.join(directory, MANIFEST))  # no manifest: nothing reads a partial job
    # what a worker that died mid-shard leaves: a temporary file, and a shard of no record file of this job
    open(os.path.join(directory, shard_name(1, 0) + ".tmp-dead"), "wb").write(b"partial")
    open(os.path.join(directory, shard_name(7, 0)), "wb").write(b"stale")
    write_records(broken, vectors, ids)  # the record repaired; the job runs again into the same folder
    shards = encoding.encode_to_shards(model, [files[2], broken], 3, directory, TWO_PROCESSES, **SMALL)
    index = index_factory(shards.manifest["code_bytes"] * 8, "BFlat")
    fill_index(index, shards)
    assert sorted(index.ids().tolist()) == sorted([*ids.tolist(), *database(n=470)[1][300:].tolist()])  # every id exactly once
    exact = index_factory(shards.manifest["code_bytes"] * 8, "BMIH")
    fill_index(exact, shards)  # every code in one add: one segment, the same items in the same order
    assert len(exact.segments) == 1 and exact.ids().tolist() == index.ids().tolist()
    assert sorted(os.listdir(directory)) == sorted([*(e["name"] for e in shards.manifest["shards"]), MANIFEST])


@pytest.mark.beam
def test_a_split_without_records_and_a_stale_manifest_end_nothing_silently(split, tmp_path):
    files, model, other = split
    with pytest.raises(Exception, match=r"hold no records to encode"):
        encoding.encode_to_shards(model, [files[1]], 3, str(tmp_path / "empty"), IN_MEMORY, **SMALL)
    assert not os.path.exists(tmp_path / "empty" / MANIFEST)
    directory = str(tmp_path / "shards")
    encoding.encode_to_shards(model, files, 3, directory, IN_MEMORY, **SMALL)
    assert encoding.ShardJob(model, tuple(files), 3, directory, "serving_text").done() is None  # another signature's job
    vectors, ids = database(n=300)
    broken = write_records(str(tmp_path / "b.gz"), vectors, ids, bad_at=5)
    with pytest.raises(Exception, match="a record failed to encode"):  # another job into the same folder fails...
        encoding.encode_to_shards(other, [broken], 3, directory, IN_MEMORY, **SMALL)
    assert not os.path.exists(os.path.join(directory, MANIFEST))  # ...and leaves no manifest of the earlier job behind


def test_parts_must_be_whole_batches(split, tmp_path):
    files, model, _ = split
    with pytest.raises(ValueError, match=r"part_records \(100\) must be a positive multiple of batch_size \(64\)"):
        encoding.EncodeToShards(model, files, 3, str(tmp_path), batch_size=64, part_records=100)


@pytest.mark.beam
def test_a_finished_job_is_read_back_by_a_model_of_the_same_fingerprint_only(split, tmp_path):
    files, model, other = split
    cache = str(tmp_path / "cache")
    pushed = str(shutil.copytree(model, tmp_path / "pushed" / "1"))  # what the Pusher does
    jobs = [encoding.ShardJob(path, tuple(files), 3, encoding.shards_dir(cache, path, files, 3)) for path in (model, pushed, other)]
    assert jobs[0].directory == jobs[1].directory != jobs[2].directory
    assert jobs[1].done() is None
    (first,) = encoding.run_shard_jobs(beam.Pipeline(options=PipelineOptions(IN_MEMORY)), jobs[:1], **SMALL)
    manifest = os.path.join(first.directory, MANIFEST)
    written = os.stat(manifest).st_mtime_ns
    again, fresh = encoding.run_shard_jobs(beam.Pipeline(options=PipelineOptions(IN_MEMORY)), jobs[1:], **SMALL)
    assert os.stat(manifest).st_mtime_ns == written and again.manifest == first.manifest  # the pushed copy reads them back
    assert fresh.directory == jobs[2].directory and not np.array_equal(fresh.codes_and_ids()[0], first.codes_and_ids()[0])
