"""The database side at scale: encoding, evaluation and index building over millions of records.

A database of ``--sizes`` records is generated from the main job's real database records (each a
seeded random record of that split, its image shifted by up to two pixels, with a new id) and
written as gzipped TFRecord files of ``--file-records`` records each; the main job's pushed model
encodes it three ways, each in a fresh process whose process tree is sampled for resident memory:

* ``in-process``: :func:`tfhash.components.encoding.encode_split` (every code, label and id in one
  process: the reference);
* ``beam in-memory``: :func:`tfhash.components.encoding.encode_to_shards` on the direct runner in
  memory;
* ``beam 2 processes``: the same on the direct runner's multi-process mode with 2 workers, TF at
  one thread per worker process.

Then, on the shards: the RetrievalEvaluator's metrics for the main job's 1,000 queries
(:func:`tfhash.metrics.evaluate_retrieval_sharded`), and a BFlat and a Milvus Lite index filled
from the shards (:func:`tfhash.components.index_builder.fill_index`) and saved. Needs the main job
run first (``bash scripts/run_main.sh``)::

    python -m benchmarks.database_scale --sizes 1000000 5000000 --seed 0

Cost on these 2 cores (quiet): about 5,200 records a second on every path, so each path takes
about 16 minutes at 5,000,000 records; generating the records (untimed) takes as long again as one
path, and the whole run at 1M and 5M about 85 minutes.

Writes ``benchmarks/results/database_scale.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.common import markdown_table, positive_int, write_results

IN_MEMORY = ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
TWO_PROCESSES = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]
MAIN_CONFIG = "pipelines/configs/mnist.json"
NUM_CLASSES = 10
QUERIES = 1000


def main_job() -> dict:
    """The main job's pushed model and its query and database record files (from its ML Metadata)."""
    from tfhash.components.encoding import split_files
    from tfhash.pipelines.config import PipelineConfig
    from tfhash.pipelines.runner import run_outputs

    config = PipelineConfig.load(MAIN_CONFIG)
    outputs = run_outputs(config)
    if not outputs:
        raise SystemExit(f"no run of {MAIN_CONFIG} found: run the main job first (bash scripts/run_main.sh)")
    examples = outputs[("RecordFilter", "filtered_examples")].uri
    pushed = outputs[("Pusher", "pushed_model")]
    model = pushed.custom_properties["pushed_destination"].string_value
    return {"model": model, "queries": split_files(examples, "query"), "database": split_files(examples, "database")}


def generate(source: list[str], size: int, file_records: int, seed: int, directory: Path) -> list[str]:
    """``size`` records drawn (seeded) from the ``source`` records, each image shifted by a seeded
    offset of -2..2 pixels in each direction and given the id ``position``; kept in ``directory``
    (reused when complete)."""
    import numpy as np
    import tensorflow as tf

    done = directory / "COMPLETE"
    files = [str(directory / f"part-{i:05d}.gz") for i in range(-(-size // file_records))]
    if done.is_file() and done.read_text() == json.dumps([size, file_records, seed]):
        return files
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    records = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(source, compression_type="GZIP")]
    images = [tf.io.decode_png(e.features.feature["image"].bytes_list.value[0]).numpy() for e in records]
    labels = [list(e.features.feature["labels"].int64_list.value) for e in records]
    rng = np.random.default_rng(seed)
    for number, path in enumerate(files):
        count = min(file_records, size - number * file_records)
        picks, shifts = rng.integers(0, len(records), count), rng.integers(-2, 3, (count, 2))
        with tf.io.TFRecordWriter(path, options="GZIP") as writer:
            for row, (pick, shift) in enumerate(zip(picks, shifts, strict=True)):
                image = np.roll(images[pick], tuple(shift), axis=(0, 1))
                feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.io.encode_png(image).numpy()])),
                           "labels": tf.train.Feature(int64_list=tf.train.Int64List(value=labels[pick])),
                           "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[number * file_records + row]))}  # fmt: skip
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    done.write_text(json.dumps([size, file_records, seed]))
    return files


# --- the steps, each run in a child process (python -m benchmarks.database_scale --step ...) --------


def step(name: str, spec: dict) -> dict:
    """Run one measured step; return what it reports besides wall time and memory."""
    from tfhash.components import encoding
    from tfhash.components.code_shards import CodeShards

    if name == "in-process":
        codes, _, ids, _ = encoding.encode_split(spec["model"], spec["files"], NUM_CLASSES)
        return {"items": int(len(ids))}
    if name.startswith("beam"):
        args, threads = (IN_MEMORY, None) if name == "beam in-memory" else (TWO_PROCESSES, 1)
        shards = encoding.encode_to_shards(spec["model"], spec["files"], NUM_CLASSES, spec["shards"], args, tf_threads=threads)
        return {"items": len(shards)}
    shards = CodeShards.open(spec["shards"])
    if name == "evaluate":
        from tfhash.metrics import evaluate_retrieval_sharded

        q_codes, q_labels, _, _ = encoding.encode_split(spec["model"], spec["queries"], NUM_CLASSES)
        report = evaluate_retrieval_sharded(q_codes[:QUERIES], q_labels[:QUERIES], shards.codes_and_labels, tie_aware=True,
                                            precision_at=[1000])  # fmt: skip
        return {"items": len(shards), "mAP@all": report.mean_average_precision(), "P@H<=2": float(report.summary(radius=2)["P@H<=2"])}
    from tfhash.components.index_builder import fill_index

    from tfhash.index import index_factory

    placement = {"uri": spec["milvus"], "collection": "scale", "replace": True} if name == "Milvus" else {}
    index = index_factory(shards.manifest["code_bytes"] * 8, name, **placement)
    try:
        fill_index(index, shards)
        index.save(spec["index"], model_version="1", signature_fingerprint=shards.manifest["signature_fingerprint"])
    finally:
        index.close()
    return {"items": len(shards)}


def measured(name: str, spec: dict) -> dict:
    """Run ``step(name, spec)`` in a child process; its wall time (``seconds``, the interpreter's
    start and imports included), the step's own time (``step seconds``, which ``items/s`` divides
    by), and the peak resident memory of each process of its tree (sampled every 0.2 s)."""
    import psutil

    command = [sys.executable, "-m", "benchmarks.database_scale", "--step", name, "--spec", json.dumps(spec)]
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peaks: dict[int, tuple[float, str]] = {}

    def sample():
        root = psutil.Process(child.pid)
        while child.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                for process in tree:
                    rss = process.memory_info().rss / 2**30
                    if rss > peaks.get(process.pid, (0.0, ""))[0]:
                        peaks[process.pid] = (rss, " ".join(process.cmdline()[1:4])[:60])
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate()
    sampler.join()
    if child.returncode:
        raise SystemExit(f"step {name!r} failed ({child.returncode})")
    seconds = time.perf_counter() - start
    report = json.loads(out.strip().splitlines()[-1])
    ordered = sorted(peaks.values(), reverse=True)
    return {"step": name, "seconds": round(seconds, 1), **report, "items/s": round(report["items"] / report["step seconds"], 1),
            "processes": len(ordered), "peak RSS GB (largest process)": round(ordered[0][0], 2) if ordered else None,
            "peak RSS GB (each)": [round(rss, 2) for rss, _ in ordered]}  # fmt: skip


def disk_gb(path: str) -> float:
    return round(sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**30, 3)


def markdown(payload: dict) -> str:
    return "\n".join(["# The database side at scale (python -m benchmarks.database_scale)", "",
                      "Generated databases derived from the main job's database records (seeded shifts of real "
                      f"MNIST images, seed {payload['seed']}), encoded by the main job's pushed model. Each step ran in a "
                      "fresh process; peak resident memory is sampled over its process tree. Beam's ratio is its throughput "
                      "over the in-process encoder's at the same size, measured in the same run.", "",
                      markdown_table(payload["rows"], ["size", "step", "seconds", "step seconds", "items/s", "ratio to in-process", "processes",
                                                       "peak RSS GB (largest process)", "peak RSS GB (each)", "mAP@all", "P@H<=2"]),
                      "", markdown_table(payload["disk"], ["size", "records GB", "shards GB"]), ""])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", type=positive_int, default=[1_000_000, 5_000_000])
    parser.add_argument("--file-records", type=positive_int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", default="runs/database_scale")
    parser.add_argument("--step", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:  # a child process: one measured step, timed without the interpreter's start
        start = time.perf_counter()
        report = step(args.step, json.loads(args.spec))
        print(json.dumps({**report, "step seconds": round(time.perf_counter() - start, 1)}), flush=True)
        return
    job, work = main_job(), Path(args.work_dir)
    rows, disk = [], []
    for size in args.sizes:
        files = generate(job["database"], size, args.file_records, args.seed, work / f"records-{size}")
        spec = {"model": job["model"], "files": files, "queries": job["queries"], "milvus": str(work / f"milvus-{size}.db")}
        reference = None
        for name in ("in-process", "beam in-memory", "beam 2 processes"):
            shards = work / f"shards-{size}-{name.replace(' ', '-')}"
            shutil.rmtree(shards, ignore_errors=True)
            row = {"size": size, **measured(name, {**spec, "shards": str(shards)})}
            reference = row["items/s"] if name == "in-process" else reference
            row["ratio to in-process"] = round(row["items/s"] / reference, 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
        spec["shards"] = str(shards)
        for name in ("evaluate", "BFlat", "Milvus"):
            row = {"size": size, **measured(name, {**spec, "index": str(work / f"index-{size}-{name}")})}
            rows.append(row)
            print(json.dumps(row), flush=True)
        disk.append({"size": size, "records GB": disk_gb(str(work / f"records-{size}")), "shards GB": disk_gb(str(shards))})
        write_results("database_scale", {"seed": args.seed, "rows": rows, "disk": disk}, markdown({"seed": args.seed, "rows": rows, "disk": disk}))


if __name__ == "__main__":
    main()
