"""STUB (being completed by the options work): field names here are the contract.

Other modules may rely on these field names and defaults. Validation, ``from_dict``,
``from_spark_conf``, profiles and documentation are being added.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StateBackendOptions:
    parallelism: int | None = None
    max_parallelism: int = 128
    num_retained: int = 3
    incremental: bool = True
    local_recovery: bool = True
    local_dir: str | None = None
    num_local_retained: int = 2
    upload_threads: int = 4
    download_threads: int = 4
    snapshot_compression: str = "snappy"
    timer_service: str = "rocksdb"
    predefined_profile: str = "DEFAULT"
    block_cache_size: int | None = None
    block_size: int | None = None
    write_buffer_size: int | None = None
    max_write_buffer_number: int | None = None
    bloom_filter_bits_per_key: float | None = 10.0
    compaction_style: str | None = None
    compression_per_level: tuple[str, ...] | None = None
    max_open_files: int | None = None
    max_background_jobs: int | None = None
    bounded_memory: bool = True
    memory_budget: int = 256 * 1024 * 1024
    extra: dict = field(default_factory=dict)
