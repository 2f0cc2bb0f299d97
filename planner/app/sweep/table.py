"""A sweep's results table: one row per point, as Parquet (pyarrow) and CSV side by side.

Columns, in order: ``model``, ``batch`` (when the spec sweeps it), ``shapes``, ``chip``, one
column per swept chip key named exactly as its ``--set`` key (``sram.bytes``, in bytes: the
value in the built chip), then ``rules``, ``solver``, ``objective``, ``status``, ``gap``,
``dram_bytes``, ``compulsory_dram_bytes``, ``layer_by_layer_dram_bytes``, ``x_floor``,
``x_layer``, ``cycles``, ``energy_pj``, ``groups``, ``solve_s``, ``verified``, ``plan``,
``monotone``, ``error``, ``key``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuseplan.planner.app.sweep.rows import PointResult
from fuseplan.planner.core.files import write_atomic

if TYPE_CHECKING:  # pyarrow loads when a table is written or read, not with the package
    import pyarrow as pa

__all__ = ["COLUMNS", "read_table", "to_arrow", "write_table"]

# (column, arrow type name) after the model/chip/axis columns
COLUMNS: tuple[tuple[str, str], ...] = (
    ("rules", "string"), ("solver", "string"), ("objective", "string"), ("status", "string"),
    ("gap", "float64"), ("dram_bytes", "int64"), ("compulsory_dram_bytes", "int64"),
    ("layer_by_layer_dram_bytes", "int64"), ("x_floor", "float64"), ("x_layer", "float64"),
    ("cycles", "int64"), ("energy_pj", "float64"), ("groups", "int64"), ("solve_s", "float64"),
    ("verified", "bool"), ("plan", "string"), ("monotone", "string"), ("error", "string"),
    ("key", "string"),
)


def _axis_type(values: Sequence[Any]) -> str:
    """The arrow type of a swept key's column: integers stay integers (bytes)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "bool"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int64"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "float64"
    return "string"


def to_arrow(rows: Sequence[PointResult], axis_keys: Sequence[str], batched: bool) -> pa.Table:
    """The rows as an Arrow table with a fixed schema (empty columns keep their type)."""
    import pyarrow as pa

    types = {"string": pa.string(), "float64": pa.float64(), "int64": pa.int64(),
             "bool": pa.bool_()}
    columns: dict[str, list[Any]] = {"model": [r.model for r in rows]}
    schema = [("model", "string")]
    if batched:
        columns["batch"] = [r.batch for r in rows]
        schema.append(("batch", "int64"))
    columns["shapes"] = [r.shapes for r in rows]
    columns["chip"] = [r.chip for r in rows]
    schema += [("shapes", "string"), ("chip", "string")]
    for key in axis_keys:
        values = [dict(r.axes).get(key) for r in rows]
        kind = _axis_type(values)
        columns[key] = [None if v is None else (str(v) if kind == "string" else v)
                        for v in values]
        schema.append((key, kind))
    for name, kind in COLUMNS:
        columns[name] = [getattr(r, name) for r in rows]
        schema.append((name, kind))
    return pa.table({name: pa.array(columns[name], type=types[kind]) for name, kind in schema})


def write_table(rows: Sequence[PointResult], axis_keys: Sequence[str], batched: bool,
                stem: Path) -> tuple[Path, Path]:
    """Write ``STEM.parquet`` and ``STEM.csv`` atomically; return their paths."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    table = to_arrow(rows, axis_keys, batched)
    parquet, csv = stem.with_suffix(".parquet"), stem.with_suffix(".csv")
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    write_atomic(parquet, buffer.getvalue(), "results table")
    buffer = io.BytesIO()
    pcsv.write_csv(table, buffer)
    write_atomic(csv, buffer.getvalue(), "results table")
    return parquet, csv


def read_table(path: str | Path) -> list[dict[str, Any]]:
    """A results table (Parquet) as a list of row dicts."""
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())
