"""Option validation: one frozen model, built on the driver; every error names the option."""

from __future__ import annotations

import pickle

import pytest

from cdc_common.uris import redact_uri as strip_secrets  # the one redaction (was options')
from connector.errors import OptionError
from connector.options import SourceOptions
from connector.tunnel import StartPosition, TunnelType

BASE = {"endpoint": "local:///data/store.db", "table.name": "orders", "tunnel.name": "t1"}


def lower(options: dict[str, str]) -> dict[str, str]:
    """Spark hands options over with lower-cased keys."""
    return {k.lower(): v for k, v in options.items()}


def test_defaults_and_case_insensitive_keys():
    opts = SourceOptions.from_spark(lower({**BASE, "maxOffsetsPerChannel": "50",
                                           "tunnel.type": "basEandstream",
                                           "startingPosition": "latest",
                                           "failOnDataLoss": "FALSE"}))
    assert opts.max_offsets_per_channel == 50
    assert opts.tunnel_type is TunnelType.BASE_AND_STREAM
    assert opts.starting_position is StartPosition.LATEST
    assert opts.fail_on_data_loss is False
    assert opts.commit_interval == 1 and opts.skip_empty_batches is True
    assert opts.max_offsets_per_trigger is None
    # the meta store defaults to a SQLite file beside the store
    assert opts.meta_store == "sqlite:///data/store.meta.db"
    assert pickle.loads(pickle.dumps(opts)) == opts


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        ({"maxOffsetsPerChannel": "0"}, ["'maxOffsetsPerChannel'", "'0'", "an integer >= 1"]),
        ({"maxOffsetsPerChannel": "ten"}, ["'maxOffsetsPerChannel'", "'ten'"]),
        ({"commitInterval": "-2"}, ["'commitInterval'", "'-2'"]),
        ({"failOnDataLoss": "yes"}, ["'failOnDataLoss'", "'yes'", "true or false"]),
        ({"tunnel.type": "Batch"}, ["'tunnel.type'", "'Batch'", "Stream or BaseAndStream"]),
        ({"startingPosition": "middle"}, ["'startingPosition'", "earliest or latest"]),
        ({"maxOffsetPerChannel": "5"}, ["unknown option", "did you mean 'maxOffsetsPerChannel'"]),
        ({"colour": "blue"}, ["'colour'", "unknown option", "no similar option"]),
        ({"path": "/x"}, ["'path'", "load(path) is not supported"]),
        ({"startingTimestamp": "2026-01-01T00:00:00"}, ["'startingTimestamp'", "has no zone"]),
        ({"startingTimestamp": "yesterday"}, ["'startingTimestamp'", "ISO-8601"]),
        ({"startingTimestamp": "1", "startingPosition": "latest"},
         ["'startingTimestamp'", "conflicts with startingPosition"]),
        ({"startingTimestamp": "1", "tunnel.type": "BaseAndStream"},
         ["'startingTimestamp'", "BaseAndStream"]),
        ({"maxTriggerDelay": "5m"}, ["'maxTriggerDelay'", "minOffsetsPerTrigger is not set"]),
        ({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "soon"},
         ["'maxTriggerDelay'", "is not a duration"]),
        ({"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"},
         ["'minOffsetsPerTrigger'", "above maxOffsetsPerTrigger"]),
        ({"maxBytesPerTrigger": "10 parsecs"}, ["'maxBytesPerTrigger'", "not a number of bytes"]),
        ({"maxBytesPerTrigger": "0"}, ["'maxBytesPerTrigger'", ">= 1"]),
        ({"onDataLoss": "ignore"}, ["'onDataLoss'", "'ignore'", "fail or resnapshot"]),
        ({"onDataLoss": "resnapshot", "failOnDataLoss": "true"},
         ["'onDataLoss'", "conflicts with failOnDataLoss=true"]),
    ],
)
def test_bad_values_name_option_value_and_allowed(extra, fragments):
    with pytest.raises(OptionError) as info:
        SourceOptions.from_spark(lower({**BASE, **extra}))
    for fragment in fragments:
        assert fragment in str(info.value)


def test_on_data_loss_resnapshot_goes_on_after_a_gap():
    """``onDataLoss=resnapshot`` reads past trimmed records as ``failOnDataLoss=false`` does
    (and records a signal, connector/data_loss.py); ``fail`` is today's default."""
    assert SourceOptions.from_spark(BASE).on_data_loss.value == "fail"
    assert SourceOptions.from_spark(BASE).fail_on_data_loss is True
    opts = SourceOptions.from_spark(lower({**BASE, "onDataLoss": " Resnapshot "}))
    assert opts.on_data_loss.value == "resnapshot" and opts.fail_on_data_loss is False
    assert pickle.loads(pickle.dumps(opts)) == opts


@pytest.mark.parametrize("missing", ["endpoint", "table.name", "tunnel.name"])
def test_required_options(missing):
    options = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(OptionError, match=f"'{missing}': is required"):
        SourceOptions.from_spark(lower(options))


def test_endpoint_must_be_absolute_local_uri():
    with pytest.raises(OptionError, match="absolute path"):
        SourceOptions.from_spark({**BASE, "endpoint": "local://relative/store.db"})
    with pytest.raises(OptionError, match="not a URI"):
        SourceOptions.from_spark({**BASE, "endpoint": "store.db"})


def test_non_local_endpoint_needs_meta_store():
    with pytest.raises(OptionError, match="'meta.store': is required for this endpoint"):
        # (an http/https Tablestore endpoint defaults to a meta table in its instance)
        SourceOptions.from_spark({**BASE, "endpoint": "dynamodb-streams://orders?region=x"})


def test_identity_never_carries_secrets():
    opts = SourceOptions.from_spark({
        **BASE, "endpoint": "local:///data/store.db?access_key_secret=hunter2&region=x",
    })
    assert "hunter2" not in opts.source_identity + opts.legacy_namespace
    assert opts.legacy_namespace == "local:///data/store.db?region=x#orders#t1"
    assert opts.source_identity == "local:/data/store.db#orders#t1"
    assert strip_secrets("dynamodb://user:pw@host/t?token=abc&a=1") == "dynamodb://host/t?a=1"


def test_option_error_survives_pickling():
    err = OptionError(option="x", value="1", problem="bad", allowed="good")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is OptionError and copy.option == "x" and str(copy) == str(err)


def test_timestamps_durations_and_sizes():
    opts = SourceOptions.from_spark(lower({
        **BASE, "startingTimestamp": "2026-01-01T08:00:00+08:00", "minOffsetsPerTrigger": "5",
        "maxTriggerDelay": "90s", "maxBytesPerTrigger": "64m"}))
    assert opts.starting_timestamp == 1_767_225_600_000  # 2026-01-01T00:00:00Z
    assert opts.max_trigger_delay_ms == 90_000 and opts.min_offsets_per_trigger == 5
    assert opts.max_bytes_per_trigger == 64 * 1024 * 1024
    assert SourceOptions.from_spark({**BASE, "startingTimestamp": "1767225600000"}
                                    ).starting_timestamp == 1_767_225_600_000
    defaults = SourceOptions.from_spark(BASE)
    assert defaults.max_trigger_delay_ms == 15 * 60 * 1000 and defaults.starting_timestamp is None


def test_ending_timestamp_belongs_to_batch_reads_and_needs_a_start_before_it():
    stream = SourceOptions.from_spark({**BASE, "endingTimestamp": "2000"})
    with pytest.raises(OptionError, match="batch read"):
        stream.check_for_stream()
    with pytest.raises(OptionError, match="'startingTimestamp': is required for a batch read"):
        stream.check_for_batch()
    backwards = SourceOptions.from_spark({**BASE, "startingTimestamp": "3000",
                                          "endingTimestamp": "2000"})
    with pytest.raises(OptionError, match="not after startingTimestamp"):
        backwards.check_for_batch()
    SourceOptions.from_spark({**BASE, "startingTimestamp": "1000",
                              "endingTimestamp": "2000"}).check_for_batch()


@pytest.mark.parametrize("endpoint", ["htp://127.0.0.1:38421", "127.0.0.1:38421",
                                      "localhost:38421", "ftp://host/store.db"])
@pytest.mark.parametrize("extra", [
    {},  # without instance.name the Tablestore checks used to blame access.key.id
    {"instance.name": "dev", "access.key.id": "AKID",
     "access.key.secret": "hunter2-secret"},
])
def test_an_endpoint_without_a_known_scheme_is_named_before_any_other_option(endpoint, extra):
    """A mistyped scheme, or a host and port without one, is reported as the endpoint's
    problem with the schemes there are; the Tablestore options given with it are not blamed."""
    with pytest.raises(OptionError) as info:
        SourceOptions.from_spark(lower({**BASE, "endpoint": endpoint, **extra}))
    message = str(info.value)
    assert message.startswith("option 'endpoint': ")
    for scheme in ("local:///", "http://", "https://", "dynamodb-streams://"):
        assert scheme in message
    assert "instance.name" not in message and "access.key" not in message
    assert "hunter2" not in message


def test_the_default_meta_table_is_written_once() -> None:
    """The option table states the Tablestore rules' default meta table (the docs are generated
    from it)."""
    from connector.options import OPTIONS
    from connector.tunnel.tablestore.endpoint import DEFAULT_CHECKPOINT_TABLE

    assert OPTIONS["checkpoint.table"].default == f"`{DEFAULT_CHECKPOINT_TABLE}`"
    assert DEFAULT_CHECKPOINT_TABLE in OPTIONS["checkpoint.table"].allowed
