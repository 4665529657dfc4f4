"""Adoption of a changelog-mode materialization when its manifest does not read back
whole (a store whose writes are not all or nothing)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from statebackend.model.manifest import MaterializationRef
from statebackend.storage import open_store
from tests.checkpoint.test_changelog import (
    OP,
    Background,
    Model,
    _batch,
    options,
    restore_durable,
)
from tests.checkpoint.test_changelog import background as background  # noqa: F401 - fixture


@pytest.mark.faults
def test_a_materialization_manifest_read_half_written_is_not_adopted_yet(
        tmp_path: Path, background: Background) -> None:
    # On a store whose writes are not all or nothing, the next batch can read the
    # materialization's manifest while it is being written: that batch checkpoints on its
    # old base (the materialization stays pending) instead of failing.
    store = open_store(str(tmp_path / "durable"), backoff_s=0.0)
    opts = options(materialize_interval=2)
    model: Model = {}
    m1 = _batch(store, tmp_path, opts, None, 1, model)
    ref = m1.pending_materialization
    assert ref == MaterializationRef(1, "a0")
    path = str(tmp_path / "durable" / OP / ref.path(0))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write('{"operator_id": "')
    m2 = _batch(store, tmp_path, opts, m1, 2, model)
    assert m2.metrics["changelog"]["adoption"] == "pending"
    assert m2.pending_materialization == ref and m2.materialization is None
    assert restore_durable(store, m2, opts) == model
    os.unlink(path)  # the write completes: the upload publishes it whole
    background.run_all()
    m3 = _batch(store, tmp_path, opts, m2, 3, model)
    assert m3.materialization == ref and m3.metrics["changelog"]["adoption"] == "adopted"
    assert restore_durable(store, m3, opts) == model
