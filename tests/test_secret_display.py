"""What a shown URI and Spark's redaction keep and hide (``cdc_common.uris``): an Azure URI's
container is no secret and stays; the regexes ``connector.spark.local_session`` gives Spark
follow the one rule of secrets and leave a target's marker readable (checked here with Python's
``re``, which reads these Java regexes the same way; ``test_spark_redaction`` checks Spark
itself)."""

from __future__ import annotations

import re

import pytest

from cdc_common.uris import (
    SPARK_OPTIONS_REGEX,
    SPARK_SECRET_REGEX,
    SPARK_STRING_REGEX,
    redact_uri,
)
from tablestore_cdc.lakehouse.ownership import JOB_PROPERTY, KEYS_PROPERTY, SOURCE_PROPERTY


@pytest.mark.parametrize("uri, shown", [
    ("abfss://lake@acct.dfs.core.windows.net/cdc/t", "abfss://lake@acct.dfs.core.windows.net/cdc/t"),
    ("delta+abfss://lake-01@acct.dfs.core.windows.net/p/{table}",
     "delta+abfss://lake-01@acct.dfs.core.windows.net/p/{table}"),
    ("wasbs://c0ntainer@acct.blob.core.windows.net/x", "wasbs://c0ntainer@acct.blob.core.windows.net/x"),
    # a password, or a user part that is no container's name (a SAS token, upper case): gone
    ("abfss://lake:pw@acct.dfs.core.windows.net/x", "abfss://acct.dfs.core.windows.net/x"),
    ("abfss://sv=2022&sig=abc@acct.dfs.core.windows.net/x", "abfss://acct.dfs.core.windows.net/x"),
    ("abfss://Lake@acct.dfs.core.windows.net/x", "abfss://acct.dfs.core.windows.net/x"),
    # other schemes keep dropping any user info, a user name alone included
    ("s3://AKIA@bucket/p", "s3://bucket/p"), ("https://token@host/x", "https://host/x"),
    ("delta+s3://bucket/p/{table}?aws_secret_access_key=s", "delta+s3://bucket/p/{table}"),
])
def test_a_shown_uri_keeps_an_azure_container(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown


@pytest.mark.parametrize("key, value, hidden", [
    ("access.key.secret", "x", True), ("security.token", "x", True),
    ("access.key.id", "x", True),  # Spark's own default hides it too
    ("spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net", "x", True),
    ("spark.sql.catalog.lake.credential", "id:secret", True),
    ("spark.hadoop.fs.s3a.session.token", "x", True),
    ("meta.store", "dynamodb://AKIA:pw@cdc-meta", True),  # a URL with user info
    ("spark.hadoop.fs.oss.accessKeySecret", "x", True),
    ("spark.hadoop.fs.gs.auth.service.account.private.key", "x", True),
    ("spark.sql.catalog.lake.header.Authorization", "Bearer x", True),
    ("endpoint", "https://inst.cn-hangzhou.ots.aliyuncs.com", False),
    ("table.name", "orders", False), ("spark.app.name", "tablestore-cdc-replicate", False),
    ("spark.sql.session.timeZone", "UTC", False),
    # a target's marker, which the Spark engine reads back with SHOW TBLPROPERTIES (redacted
    # by the same regexes): a harmless word of the one rule (key, session, auth) must not hide it
    (KEYS_PROPERTY, '["id"]', False), (SOURCE_PROPERTY, "local:///data/author/s.db#t", False),
    (JOB_PROPERTY, "/srv/session-jobs/orders", False),
])
def test_spark_hides_a_property_or_option_by_the_one_rule(key: str, value: str,
                                                          hidden: bool) -> None:
    # Spark hides the value when its key or its value matches (Utils.redact)
    for regex in (SPARK_SECRET_REGEX, SPARK_OPTIONS_REGEX):
        assert bool(re.search(regex, key) or re.search(regex, value)) is hidden


@pytest.mark.parametrize("text, shown", [
    ("FileSink[s3a://AKIA:pw@bucket/out]", "FileSink[s3a*bucket/out]"),
    ("Relation [path=oss://b/x?access_key_secret=s3cr3t&region=r1]",
     "Relation [path=oss://b/x*&region=r1]"),
    ("MicroBatchScan[id#0L] (Python)", "MicroBatchScan[id#0L] (Python)"),
])
def test_a_plans_text_loses_user_info_and_secret_query_pairs(text: str, shown: str) -> None:
    assert re.sub(SPARK_STRING_REGEX, "*", text) == shown
