"""What a run reads its data from, and what reading it has cost: ``describe``'s and the console's ``Data:`` line.

A dataset in a bucket (``data.path=s3://...``) is named with the store's endpoint the launch resolved, and the
newest metrics row's counters of the attempt (launcher/train/loop.py ``stream_row``: megabytes downloaded, shards
fetched, cache hits, the seconds a rank's steps waited for shards).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from launcher.core.config import DataConfig
from launcher.core.metrics import Row
from launcher.core.store import is_remote


def reading(data: DataConfig, latest: Optional[Row]) -> Dict[str, Any]:
    """The run's data source and, for a bucket, what the attempt's reading cost so far (None before a row)."""
    remote = is_remote(data.path)
    source = data.path or "the standard-library corpus"
    row = latest if latest is not None else Row(step=0)  # before the first row every counter is null
    info: Dict[str, Any] = {"source": source, "endpoint": data.store.endpoint_url if remote else None,
                            "data_mb": row.data_mb, "shards_fetched": row.shards_fetched, "cache_hits": row.cache_hits,
                            "data_wait_s": row.data_wait_s}
    info["line"] = line(info)
    return info


def line(info: Dict[str, Any]) -> str:
    where = f"{info['source']} at {info['endpoint']}" if info["endpoint"] else str(info["source"])
    if info["data_mb"] is None:
        return f"Data:        {where}"
    return (f"Data:        {where}; this attempt: {info['data_mb']:,.1f} MB downloaded ({info['shards_fetched']} "
            f"shards fetched, {info['cache_hits']} cache hits), {info['data_wait_s']:.1f} s waited for data per rank")
