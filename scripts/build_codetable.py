"""Regenerate tfhash/resources/binary_code_min_distance.csv.gz from the code table in
../shared/data/codetables/ (best-known minimum Hamming distance d of binary codes of length K with
2^j codewords, the table HyP2 takes its margins from). Only K, j and d are kept; zeta = 1 - 2d/K is
derived in tfhash.losses.hyp2.

    .venv/bin/python scripts/build_codetable.py [--source PATH]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from pathlib import Path

from tfhash.data import find_data_file

TARGET = Path(__file__).resolve().parents[1] / "tfhash" / "resources" / "binary_code_min_distance.csv.gz"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", default=None)
    args = parser.parse_args()
    source = Path(args.source) if args.source else find_data_file("codetables/binary_code_min_distance.csv")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["code_length", "log2_codewords", "min_distance"])
    with open(source, newline="") as handle:
        for row in csv.DictReader(handle):
            writer.writerow([int(row["code_length"]), int(row["log2_codewords"]), int(row["min_distance"])])
    # mtime=0: the same input gives byte-identical output
    TARGET.write_bytes(gzip.compress(out.getvalue().encode(), mtime=0))
    print(f"wrote {TARGET} ({TARGET.stat().st_size} bytes) from {source}")


if __name__ == "__main__":
    main()
