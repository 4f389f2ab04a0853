"""The warm-start sources (``SAMPLER_INIT_FROM``, ``SAMPLER_PRIOR_COLUMN``), checked before launch: the traces
exist and can be matched by content, and the prior column is in every train file."""
from __future__ import annotations

from collections.abc import Mapping

from ..settings import select


def check_warm_start(cfg: Mapping, errors: list[str], notes: list[str]) -> None:
    from ..adapter.warm_start import WarmStartError, trace_file
    from ..traces import read_records

    init_from, column = select(cfg, "data.sampler.init_from"), select(cfg, "data.sampler.prior_column")
    if not select(cfg, "data.sampler.class_path"):
        if init_from or column:
            notes.append("SAMPLER_INIT_FROM / SAMPLER_PRIOR_COLUMN are ignored in a baseline arm (no sampler)")
        return
    if init_from:
        try:
            path = trace_file(init_from)
        except WarmStartError as e:
            errors.append(str(e))
        else:
            records = read_records(path)
            if not records:
                errors.append(f"SAMPLER_INIT_FROM={init_from}: {path} holds no length-trace records")
            elif not all("prompt_keys" in r for r in records.values()):
                errors.append(f"SAMPLER_INIT_FROM={init_from}: these traces carry no prompt keys (written before warm "
                              "start existed), so their rows cannot be matched by content; use a newer run's traces")
            else:
                epochs = sorted({r["epoch"] for r in records.values()})
                notes.append(f"warm start from {path}: {len(records)} steps of epochs {epochs[0]}..{epochs[-1]} (its "
                             "first epoch seeds the estimates, all calibrate the cap)")
    if column:
        import pyarrow.parquet as pq

        files = select(cfg, "data.train_files")
        for f in [files] if isinstance(files, str) else list(files or []):
            try:
                names = pq.ParquetFile(f).schema_arrow.names
            except Exception:  # noqa: BLE001 - an unreadable file is reported by the data check
                continue
            if column not in names:
                errors.append(f"SAMPLER_PRIOR_COLUMN={column!r} is not a column of TRAIN_FILE {f} (has {names})")
