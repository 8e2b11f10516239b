"""The vendor's CSV data processors' folder (BertSumCSVDataProcessor, BertTokenClassifierDataProcessor): the
tests of each write one part of rows by hand."""

from __future__ import annotations

import csv
from pathlib import Path


def write_train_split(root: Path, header, rows) -> Path:
    """``root/train``: ``part.csv`` (``header``, then ``rows``) and the meta.dat that counts its rows."""
    data = root / "train"
    data.mkdir()
    with open(data / "part.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    (data / "meta.dat").write_text(f"part.csv {len(rows)}\n")
    return data
