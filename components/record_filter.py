"""RecordFilter: the pipeline's bad-record policy, right after ExampleGen.

ImportExampleGen passes the records through as raw bytes (``FORMAT_PROTO``): with its default it
parses every record as a tf.Example and a single corrupt record would crash it before any policy
could apply. Every record is checked here instead, and bad ones fail the run or are dropped, never silently.
"""


import json

import apache_beam as beam
from tfhash.components.record_validation import record_problem
from tfx.components.util import examples_utils
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils
from tfx.v1.dsl.components import (
    BeamComponentParameter,
    InputArtifact,
    OutputArtifact,
    Parameter,
    component,
)
from tfx.v1.types import standard_artifacts

from tfhash import storage
from tfhash.artifact_types import RecordReport
from tfhash.artifacts import ID, RECORDS_REPORT_FILE, read_data_description

__all__ = ["filter_records", "read_counts", "apply_policy", "RecordFilter"]


POLICIES = ("fail", "drop")


def _problem_and_id(record: bytes, num_classes: int, modalities: dict):
    from tensorflow.core.example import example_pb2

    problem = record_problem(record, num_classes, modalities)
    example_id = -1
    if problem is not None and problem != "unparsable record":
        example = example_pb2.Example.FromString(record)
        ids = example.features.feature[ID].int64_list.value
        example_id = int(ids[0]) if ids else -1
    return problem, example_id, record


def filter_records(pipeline: beam.Pipeline, input_uri: str, output_uri: str, splits: list[str], num_classes: int,
                   modalities: dict, report_dir: str) -> None:  # fmt: skip
    """Add the Beam steps: for each split, good records to ``output_uri/Split-<split>/`` (gzipped
    TFRecords), and the bad ones counted into ``report_dir`` (read with :func:`read_counts`)."""
    counts = []
    for split in splits:
        checked = (
            pipeline
            | f"Read[{split}]" >> beam.io.ReadFromTFRecord(storage.join(input_uri, f"Split-{split}", "*"),
                                                           compression_type=beam.io.filesystem.CompressionTypes.AUTO)
            | f"Check[{split}]" >> beam.Map(_problem_and_id, num_classes, modalities)
        )  # fmt: skip
        _ = (
            checked
            | f"Good[{split}]" >> beam.Filter(lambda row: row[0] is None)
            | f"Record[{split}]" >> beam.Map(lambda row: row[2])
            | f"Write[{split}]" >> beam.io.WriteToTFRecord(storage.join(output_uri, f"Split-{split}", "data_tfrecord"),
                                                           file_name_suffix=".gz")
        )  # fmt: skip
        bad = checked | f"Bad[{split}]" >> beam.Filter(lambda row: row[0] is not None)
        counts.append(bad | f"Reason[{split}]" >> beam.Map(lambda row, s=split: json.dumps([s, row[0], row[1]])))
    _ = (
        counts
        | "AllBad" >> beam.Flatten()
        | "WriteBad" >> beam.io.WriteToText(storage.join(report_dir, "bad_records"), file_name_suffix=".jsonl")
    )


def read_counts(report_dir: str, splits: list[str], sample_size: int = 20) -> dict:
    """The report of :func:`filter_records`: counts per split and reason, a sample of bad ids."""
    counts = {split: {} for split in splits}
    sample = []
    for path in storage.glob(storage.join(report_dir, "bad_records*.jsonl")):
        for line in storage.read_text(path).splitlines():
            split, reason, example_id = json.loads(line)
            counts[split][reason] = counts[split].get(reason, 0) + 1
            if len(sample) < sample_size:
                sample.append({"split": split, "reason": reason, "id": example_id})
    total = sum(sum(reasons.values()) for reasons in counts.values())
    return {"bad_records": total, "by_split": counts, "sample": sample}


def apply_policy(report: dict, policy: str) -> None:
    """Raise with the counts when ``policy`` is ``"fail"`` and the report has bad records."""
    if policy not in POLICIES:
        raise ValueError(f"unknown bad-record policy {policy!r}; choose one of {POLICIES}")
    if policy == "fail" and report["bad_records"]:
        raise ValueError(
            f"{report['bad_records']} bad records (policy 'fail'): {json.dumps(report['by_split'])}; "
            f"first ones: {json.dumps(report['sample'][:5])}. Fix the data, or set bad_records to 'drop'."
        )


@component(use_beam=True)
def RecordFilter(
    examples: InputArtifact[standard_artifacts.Examples],
    filtered_examples: OutputArtifact[standard_artifacts.Examples],
    report: OutputArtifact[RecordReport],
    data_dir: Parameter[str],
    policy: Parameter[str] = "fail",
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    """The TFX component: checks every record, writes ``report.json``, then applies ``policy``.

    ``data_dir``: the exported data, whose description (:func:`tfhash.artifacts.read_data_description`)
    gives the number of classes and each modality's kind and shape the records must have. Every record of every split is checked with :func:`tfhash.components.record_validation.record_problem`
    (a Beam job on the pipeline's runner). The counts per split and reason, and a sample of the bad
    records' ids, go to ``report.json``; then, by ``policy``:

    * ``"fail"`` (default): any bad record stops the run with an error that gives the counts;
    * ``"drop"``: bad records are left out of the ``filtered_examples`` that every later component
      reads, and the report says how many; the run summary repeats it.

    Nothing is dropped silently. The filtered output is ``FORMAT_TF_EXAMPLE`` again.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown bad-record policy {policy!r}; choose one of {POLICIES}")
    description = read_data_description(data_dir)
    splits = artifact_utils.decode_split_names(examples.split_names)
    with beam_pipeline as pipeline:
        filter_records(pipeline, examples.uri, filtered_examples.uri, splits, int(description["num_classes"]),
                       description["modalities"], report.uri)  # fmt: skip
    result = read_counts(report.uri, splits)
    result["policy"] = policy
    storage.write_json(storage.join(report.uri, RECORDS_REPORT_FILE), result)
    report.set_int_custom_property("bad_records", result["bad_records"])
    apply_policy(result, policy)
    filtered_examples.split_names = examples.split_names
    examples_utils.set_payload_format(filtered_examples, example_gen_pb2.FORMAT_TF_EXAMPLE)
