"""Shared fixtures: one local SparkSession, a moto S3 server on 127.0.0.1, and durable-store
URLs of every kind.

``spark`` is the one SparkSession of a pytest run (starting one costs ~10 s), whichever
directory uses it: tests/spark, tests/cli, tests/cluster's local[2] references. The master
is local[2,2]: two cores, and a failed task is retried once (local mode retries nothing
otherwise), which the exactly-once tests rely on.

``store_url`` is parametrised over local, memory and S3 and yields ``(url, storage_options)``;
any test that takes it runs once per filesystem.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

# Switches that run the whole suite with another default of one option, wherever tests
# build options without naming it: the default of StateBackendOptions changes in this
# process (and so in the Spark workers it forks, which receive the options built here).
# Tests that are about one setting name it.
# - STATEBACKEND_TEST_CHECKPOINT_MODE=changelog (or incremental): that checkpoint mode;
# - STATEBACKEND_TEST_MATERIALIZE_INLINE_RATIO=2 (with changelog): small materializations
#   in the critical path (materialize_inline_ratio);
# - STATEBACKEND_TEST_AUTO_CHANGELOG_SIZE=16k (with auto): the line of auto that low, so
#   partitions switch modes within the tests' small states;
# - STATEBACKEND_TEST_PLACEMENT=carrier: the streaming tests with the carrier plan
#   (statebackend.spark.carrier);
# - STATEBACKEND_TEST_ROLLING_SLICES=4: changelog-mode partitions checkpoint rolling
#   slices (statebackend.checkpoint.slices).
_SWITCHES = {"CHECKPOINT_MODE": ("checkpoint_mode", str),
             "MATERIALIZE_INLINE_RATIO": ("materialize_inline_ratio", float),
             "AUTO_CHANGELOG_SIZE": ("auto_changelog_size", str),
             "PLACEMENT": ("placement", str),
             "ROLLING_SLICES": ("rolling_slices", int)}
for _env, (_field, _kind) in _SWITCHES.items():
    if os.environ.get("STATEBACKEND_TEST_" + _env):
        from statebackend.options import StateBackendOptions

        inspect.unwrap(StateBackendOptions.__init__).__kwdefaults__[_field] = \
            _kind(os.environ["STATEBACKEND_TEST_" + _env])

SPARK_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark")

# Workers unpickle the test processors by module name: their directory must be on the
# workers' PYTHONPATH before the SparkSession (and so its Python workers) starts.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (SPARK_TESTS, os.environ.get("PYTHONPATH", "")) if p)
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
if SPARK_TESTS not in sys.path:
    sys.path.insert(0, SPARK_TESTS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of modules that start a job early (:func:`_jobs_started_early`) run last,
    in their order: by then their job has had the whole run to finish."""
    early = [item for item in items
             if getattr(getattr(item, "module", None), "start_early", None) is not None]
    late = set(early)
    items[:] = [item for item in items if item not in late] + early


@pytest.fixture(scope="session", autouse=True)
def _jobs_started_early(request: pytest.FixtureRequest) -> None:
    """Before the first test of the run, each selected module's ``start_early(request)``,
    which prepares a job and returns it; the jobs then run one after another in a
    background thread, in the order of their tests (``harness.early`` waits for one).

    A module whose set-up is a job of minutes in processes of its own (tests/connect's
    Connect server, tests/cluster's local-cluster, the driver runs of
    tests/faults/test_driver_kill.py, ...) runs it there: a job keeps about one core of
    two busy while the other tests run (many of them pure Python, on one core). One at a
    time: started all at once, a dozen JVMs on two cores made the Connect server's Python
    workers miss their connect-back timeout."""
    from harness import run_early

    modules = {}
    for item in request.session.items:
        module = getattr(item, "module", None)
        if getattr(module, "start_early", None) is not None:
            modules.setdefault(module.__name__, module)
    run_early(request, {name: module.start_early(request) for name, module in modules.items()})


@pytest.fixture(scope="session")
def spark():
    """The suite's session: ``local[2,2]`` with Spark's streaming defaults, as users run
    (no-data micro-batches on: Spark runs a micro-batch without input when a stateful
    operator asks for one, e.g. when the watermark passes a timer)."""
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2,2]").appName("statebackend-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_no_data(spark):
    """A session of the same application with no-data micro-batches off, for the queries
    that cannot end under Spark's defaults (``harness.never_ends_under_defaults``: a
    ``ProcessingTime`` transformWithState, which TTL needs, under ``availableNow``)."""
    from harness import no_data_off

    return no_data_off(spark)


@pytest.fixture(scope="session")
def fidelity_classic(spark, spark_no_data, tmp_path_factory):
    """``runs(name) -> (ours, theirs, backend)``: a fidelity case
    (tests/spark/fidelity_cases.py) run on the classic session over ``runs.input_dir``,
    ours and Spark's own operator side by side, once per pytest run.
    tests/spark/test_fidelity.py compares the two, tests/connect ours with ours on
    Connect: each case costs ~10 s of micro-batches."""
    import pandas as pd
    from fidelity_cases import CASE_BY_NAME, SCHEMA, WATERMARK, builders, fidelity_batches
    from harness import run_streams, write_batches

    from statebackend import RocksDBStateBackend, StateBackendOptions

    root = tmp_path_factory.mktemp("fidelity-classic")
    write_batches(str(root / "input"), fidelity_batches())
    done: dict[str, tuple[dict[int, Any], dict[int, Any], Any]] = {}

    def runs(name: str) -> tuple[dict[int, Any], dict[int, Any], Any]:
        if name not in done:
            case, work = CASE_BY_NAME[name], root / name
            backend = RocksDBStateBackend(str(work / "state"), StateBackendOptions(
                parallelism=2, local_dir=str(work / "local")))
            init_df = spark.createDataFrame(pd.DataFrame(
                {"k": ["user-1", "user-4", "nobody"], "init": [1000, 4000, 9000]}))
            theirs_q, ours_q = builders(case, backend, init_df)
            out = run_streams(case.session(spark, spark_no_data), str(root / "input"), SCHEMA,
                              {"ours": (ours_q, str(work / "ck-ours")),
                               "theirs": (theirs_q, str(work / "ck-spark"))},
                              WATERMARK if case.watermark else None)
            done[name] = (out["ours"], out["theirs"], backend)
        return done[name]

    runs.input_dir = str(root / "input")  # type: ignore[attr-defined]
    return runs


_S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 and a free port; yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in _S3_ENV}
    os.environ.update(_S3_ENV)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def s3_url(moto_server: str) -> tuple[str, dict[str, Any]]:
    """A fresh bucket on the moto server: ``("s3://bucket/prefix", storage_options)``."""
    import boto3

    bucket = f"sb-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(
        Bucket=bucket)
    options: dict[str, Any] = {
        "client_kwargs": {"endpoint_url": moto_server, "region_name": "us-east-1"},
        "key": _S3_ENV["AWS_ACCESS_KEY_ID"],
        "secret": _S3_ENV["AWS_SECRET_ACCESS_KEY"],
        # Buckets are fresh per test, so a cached instance's listings would only mislead.
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }
    return f"s3://{bucket}/prefix", options


@pytest.fixture
def memory_url() -> Iterator[tuple[str, dict[str, Any]]]:
    """A unique prefix of fsspec's (process-global) memory filesystem, removed afterwards."""
    import fsspec

    prefix = f"sb-test-{uuid.uuid4().hex[:12]}"
    yield f"memory://{prefix}", {}
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{prefix}"):
        fs.rm(f"/{prefix}", recursive=True)


@pytest.fixture(params=["local", "memory", pytest.param("s3", marks=pytest.mark.s3)])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> tuple[str, dict[str, Any]]:
    """``(url, storage_options)`` for a fresh, empty store root on each filesystem kind."""
    if request.param == "local":
        return str(tmp_path / "durable"), {}
    if request.param == "memory":
        return request.getfixturevalue("memory_url")
    return request.getfixturevalue("s3_url")
