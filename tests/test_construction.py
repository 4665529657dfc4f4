"""RocksDBStateBackend refuses bad configuration when it is built, not at the first batch,
and never shows storage options or URL credentials (issue 23, items 4 and 5)."""

from __future__ import annotations

import dataclasses
import logging
import pickle

import pytest

from statebackend import RocksDBStateBackend, StateBackendOptions
from statebackend.errors import OptionsError, UnknownOptionError
from statebackend.keys.ranges import DEFAULT_MAX_PARALLELISM
from statebackend.options import check_location, coerce_options
from statebackend.redact import redact_options, redact_text, redact_url
from statebackend.spark.plan import KeySpec
from statebackend.storage import open_store
from statebackend.task.context import OperatorConfig, SavepointSource

SECRET = "s3cr3t-Pa55"


# --- options ---------------------------------------------------------------------------


def test_a_dict_of_option_names_becomes_options(tmp_path) -> None:
    be = RocksDBStateBackend(str(tmp_path), options={"num_retained": 5, "parallelism": 2})
    assert isinstance(be._explicit_options, StateBackendOptions)
    assert be._explicit_options.num_retained == 5
    assert be._explicit_options.parallelism == 2


def test_a_spark_conf_mapping_becomes_options(tmp_path) -> None:
    be = RocksDBStateBackend(str(tmp_path), options={
        "spark.statebackend.num-retained": "4", "spark.app.name": "ignored"})
    assert be._explicit_options == StateBackendOptions(num_retained=4)


def test_a_misspelled_option_is_refused_at_construction(tmp_path) -> None:
    with pytest.raises(UnknownOptionError, match="num_retained"):
        RocksDBStateBackend(str(tmp_path), options={"num_retaind": 5})
    with pytest.raises(UnknownOptionError):
        RocksDBStateBackend(str(tmp_path), options={"spark.statebackend.num-retaind": "5"})


@pytest.mark.parametrize("options", ["abc", 3, ["num_retained"],
                                     {"num_retained": 5, "spark.statebackend.parallelism": "2"},
                                     {"num_retained": 0}])
def test_options_of_the_wrong_shape_are_refused(tmp_path, options) -> None:
    with pytest.raises(OptionsError):
        RocksDBStateBackend(str(tmp_path), options=options)


def test_options_object_passes_unchanged() -> None:
    o = StateBackendOptions(num_retained=7)
    assert coerce_options(o) is o
    assert coerce_options(None) is None


@pytest.mark.parametrize("storage_options", ["abc", 1, ["anon"], {1: "x"}])
def test_storage_options_must_be_a_mapping(tmp_path, storage_options) -> None:
    with pytest.raises(OptionsError) as err:
        RocksDBStateBackend(str(tmp_path), storage_options=storage_options)
    assert "storage_options" in str(err.value)


def test_storage_options_are_copied(tmp_path) -> None:
    given = {"anon": True}
    be = RocksDBStateBackend(str(tmp_path), storage_options=given)
    given["anon"] = False
    assert be.storage_options == {"anon": True}


@pytest.mark.parametrize("url", ["bogus://bucket/x", "simplecache::nope://x", "", "  ", None, 7])
def test_an_unknown_or_empty_location_is_refused_at_construction(url) -> None:
    with pytest.raises(OptionsError, match="checkpoint_location"):
        RocksDBStateBackend(url)


def test_a_protocol_whose_package_is_missing_is_refused_at_construction() -> None:
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(OptionsError, match="not installed"):
            RocksDBStateBackend("gcs://bucket/state")
    else:  # pragma: no cover - then the location is accepted
        RocksDBStateBackend("gcs://bucket/state")


def test_a_savepoint_url_with_an_unknown_protocol_is_refused_at_construction(tmp_path) -> None:
    with pytest.raises(OptionsError, match="from_savepoint"):
        RocksDBStateBackend(str(tmp_path), from_savepoint=f"bogus://u:{SECRET}@h/sp")
    RocksDBStateBackend(str(tmp_path), from_savepoint="memory://h/sp")
    RocksDBStateBackend(str(tmp_path), from_savepoint="before-upgrade")  # a name


@pytest.mark.parametrize("url", ["memory://state/x", "file:///tmp/x", "/tmp/x", "relative/dir",
                                 "simplecache::memory://x"])
def test_known_locations_are_accepted(url) -> None:
    assert check_location(url) == url
    RocksDBStateBackend(url)


def test_the_backend_still_pickles_with_converted_options(tmp_path) -> None:
    be = RocksDBStateBackend(str(tmp_path), options={"num_retained": 5},
                             storage_options={"anon": True})
    back = pickle.loads(pickle.dumps(be))
    assert back._explicit_options.num_retained == 5
    assert back.storage_options == {"anon": True}


# --- redaction -------------------------------------------------------------------------


def test_redact_url_masks_only_the_password() -> None:
    assert redact_url(f"s3://AKIA:{SECRET}@bucket/state") == "s3://AKIA:***@bucket/state"
    assert redact_url(f"ftp://u:{SECRET}@host:21/x") == "ftp://u:***@host:21/x"
    assert redact_url(f"simplecache::sftp://me:{SECRET}@h/x") == "simplecache::sftp://me:***@h/x"
    assert redact_url("s3://bucket/state") == "s3://bucket/state"
    assert redact_url("/tmp/a:b@c") == "/tmp/a:b@c"  # no scheme: not a credential


def test_redact_text_also_masks_the_rewritten_root() -> None:
    url = f"memory://u:{SECRET}@h/x"
    text = f"cannot read /u:{SECRET}@h/x/op/_checkpoints and {url}"
    out = redact_text(text, url)
    assert SECRET not in out
    assert "/u:***@h/x/op/_checkpoints" in out


def test_redact_options_shows_keys_only() -> None:
    out = redact_options({"secret": SECRET, "key": "AKIA"})
    assert SECRET not in out and "AKIA" not in out and "'secret'" in out


def _config(url: str) -> OperatorConfig:
    return OperatorConfig(operator_id="op", checkpoint_location=url,
                          storage_options={"secret": SECRET, "client_kwargs": {"token": SECRET}},
                          options=StateBackendOptions(), parallelism=2,
                          key=KeySpec(columns=("k",), types=("string",)))


def test_operator_config_repr_hides_storage_options_and_credentials() -> None:
    cfg = _config(f"s3://AKIA:{SECRET}@bucket/state")
    # a savepoint to start from carries its own location and storage options
    cfg = dataclasses.replace(
        cfg, from_savepoint=SavepointSource(f"s3://AKIA:{SECRET}@bucket/sp", {"key": SECRET}),
        ticks=True)
    text = repr(cfg) + str(cfg)
    assert SECRET not in text
    assert "s3://AKIA:***@bucket/state" in text and "'secret': ***" in text
    assert "s3://AKIA:***@bucket/sp" in text and "ticks=True" in text
    assert cfg.max_parallelism == DEFAULT_MAX_PARALLELISM


def test_backend_and_store_reprs_hide_credentials() -> None:
    be = RocksDBStateBackend(f"memory://u:{SECRET}@h/x", storage_options={"token": SECRET})
    assert SECRET not in repr(be)
    store = open_store(f"memory://u:{SECRET}@h/x")
    assert SECRET not in repr(store)


def test_store_errors_hide_credentials() -> None:
    store = open_store(f"memory://u:{SECRET}@h/x", backoff_s=0.0)
    with pytest.raises(FileNotFoundError) as err:
        store.get_bytes("nope/file")
    assert SECRET not in str(err.value)
    with pytest.raises(OptionsError) as err2:
        RocksDBStateBackend(f"bogus://u:{SECRET}@h/x")
    assert SECRET not in str(err2.value) and "u:***@h" in str(err2.value)
    assert SECRET not in repr(err2.value.value)


def test_the_listener_log_line_hides_credentials(caplog) -> None:
    from statebackend.spark.listener import _SessionListener, observation_name

    class Broken:
        checkpoint_location = f"memory://u:{SECRET}@h/x"

        def operator_ids(self):
            return ["op"]

        def complete(self, op, up_to=None, run_id=None):
            raise RuntimeError(f"cannot reach /u:{SECRET}@h/x/op")

    listener = _SessionListener.__new__(_SessionListener)  # no session: only the callback
    listener._lock = __import__("threading").Lock()
    listener._backends = {"x": Broken()}
    listener._seen = {}
    with caplog.at_level(logging.ERROR, logger="statebackend.listener"):
        listener._complete_all(3, frozenset([observation_name(Broken.checkpoint_location,
                                                              "op")]), "run-1")
    assert "cannot reach" in caplog.text and "u:***@h" in caplog.text
    assert SECRET not in caplog.text


def test_every_error_of_the_package_redacts_credentials_it_quotes() -> None:
    import traceback

    from statebackend.errors import CorruptStateError, StateError, StorageError

    for exc in (CorruptStateError(f"cannot be restored from /u:{SECRET}@h/x/op",
                                  path="chk-1/p0/a/000001.sst"),
                StorageError(f"read of memory://u:{SECRET}@h/x failed"),
                StateError(f"state at /u:{SECRET}@h/x")):
        try:
            raise exc
        except Exception:  # noqa: BLE001 - what a log line or a traceback shows
            shown = traceback.format_exc() + str(exc) + repr(exc)
        assert SECRET not in shown and "u:***@h/x" in shown


def test_the_cli_redacts_a_root_rewritten_by_the_filesystem(capsys) -> None:
    from statebackend.cli import main

    with pytest.raises(SystemExit):
        main(["verify", "--help"])
    capsys.readouterr()
    code = main(["describe", f"memory://u:{SECRET}@h/x", "op"])
    err = capsys.readouterr().err
    assert code == 3 and SECRET not in err and "u:***@h" in err


# --- issue 34: what could never be written is refused at construction --------------------


@pytest.mark.parametrize("url", ["http://example.com/state", "https://example.com/state",
                                 "zip://x.zip"])
def test_a_location_of_a_store_that_cannot_write_is_refused(url) -> None:
    with pytest.raises(OptionsError, match="can only read"):
        RocksDBStateBackend(url)
    # reading from one stays possible: a savepoint to start from
    assert check_location(url, "from_savepoint") == url


def test_a_path_with_a_nul_character_is_refused(tmp_path) -> None:
    with pytest.raises(OptionsError, match="NUL"):
        RocksDBStateBackend(f"{tmp_path}/a\x00b")
    with pytest.raises(OptionsError, match="NUL"):
        StateBackendOptions(local_dir=f"{tmp_path}/a\x00b")
    with pytest.raises(OptionsError):
        open_store(f"{tmp_path}/a\x00b")


@pytest.mark.parametrize("url", ["", "   "])
def test_open_store_refuses_an_empty_location(url) -> None:
    with pytest.raises(OptionsError, match="non-empty"):
        open_store(url)


def test_an_unwritable_local_dir_is_refused(tmp_path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad in (a_file, a_file / "sub"):
        with pytest.raises(OptionsError, match="is a file, not a directory"):
            StateBackendOptions(local_dir=str(bad))
    # a directory that does not exist yet here is created where it is used (executors)
    assert StateBackendOptions(local_dir=str(tmp_path / "new" / "dir")).local_dir
    assert StateBackendOptions(local_dir=str(tmp_path / "{executor_id}")).local_dir
