"""URLs: settings read as written, secrets never printed."""

from __future__ import annotations

import pytest

import dflow
from dflow.runtime.connect import store_from_url, transport_from_url
from dflow.wire.urls import redact_url

kafka = pytest.importorskip("dflow.adapters.kafka")


def test_passwords_and_secret_settings_are_redacted() -> None:
    assert redact_url("redis://ann:s3cr%40t@h:6379/0") == "redis://ann:***@h:6379/0"
    assert redact_url("rediss://:only-pass@h/1?ssl_ca_certs=/ca") == "rediss://:***@h/1?ssl_ca_certs=/ca"
    shown = redact_url(
        "kafka://u:p@k1:9092?topic=t&sasl_plain_password=hunter2&ssl_password=x&sasl_oauth_token=y"
    )
    assert "hunter2" not in shown and "p@" not in shown and shown.count("***") == 4
    assert "topic=t" in shown


@pytest.mark.parametrize(
    "make",
    [
        lambda: transport_from_url("amqp://user:hunter2@host/vhost"),
        lambda: store_from_url("mongodb://user:hunter2@host/db"),
        lambda: kafka.KafkaTransport.from_url("kfk://user:hunter2@host:9092?topic=t"),
    ],
)
def test_errors_about_urls_do_not_print_the_password(make: object) -> None:
    with pytest.raises(dflow.ConfigurationError) as info:
        make()  # type: ignore[operator]
    assert "hunter2" not in str(info.value) and "***" in str(info.value)


def test_kafka_settings_are_read_as_written_and_reach_every_client() -> None:
    t = kafka.KafkaTransport.from_url(
        "kafka://ann%40corp:pa%2Bss@k1:9092,k2:9092?topic=steps&security_protocol=SASL_SSL&sasl_mechanism=PLAIN"
        "&ssl_password=12345&ssl_check_hostname=false&session_timeout_ms=7000&client_id=a+b&ssl_cafile=/etc/ca.pem"
    )
    assert t.bootstrap == ["k1:9092", "k2:9092"] and t.topic == "steps"
    for options in (t.consumer_options, t.producer_options, t.admin_options):
        assert options["sasl_plain_username"] == "ann@corp", "userinfo is percent-decoded"
        assert options["sasl_plain_password"] == "pa+ss"
        assert options["ssl_password"] == "12345", "an all-digit password stays a string"
        assert options["ssl_check_hostname"] is False, "a flag setting is a flag"
        assert options["client_id"] == "a+b", "a plus stays a plus"
        assert options["ssl_cafile"] == "/etc/ca.pem" and options["security_protocol"] == "SASL_SSL"
    assert t.consumer_options["session_timeout_ms"] == 7000 and "session_timeout_ms" not in t.producer_options


@pytest.mark.parametrize(
    "url, why",
    [
        ("kafka://u:p@k:9092?topic=t", "security_protocol is PLAINTEXT, which would not use it"),
        ("kafka://u:p@k:9092?security_protocol=SASL_SSL&sasl_plain_username=v", "disagree"),
        ("kafka://k:9092?no_such_setting=1", "unknown Kafka settings: no_such_setting"),
        ("kafka://k:9092?session_timeout_ms=soon", "is not a int"),
        ("kafka://k:9092?topic=a&topic=b", "sets topic twice"),
    ],
)
def test_contradictory_or_unknown_kafka_settings_are_refused(url: str, why: str) -> None:
    with pytest.raises(dflow.ConfigurationError, match=why):
        kafka.KafkaTransport.from_url(url)
