import pytest

from wakustore.protocols import dos_protection as dos
from wakustore.protocols.message import WakuMessage

# The test vector of 57/STATUS-Simple-Scaling.
PRIVATE = bytes.fromhex("5526a8990317c9b7b58d07843d270f9cd1d9aaee129294c1c478abf7261dd9e6")
PUBLIC = bytes.fromhex(
    "049c5fac802da41e07e6cdf51c3b9a6351ad5e65921527f2df5b7d59fd9b56ab02"
    "bab736cdcfc37f25095e78127500da371947217a8cd5186ab890ea866211c3f6"
)
PAYLOAD = bytes.fromhex(
    "1A12E077D0E89F9CAC11FBBB6A676C86120B5AD3E248B1F180E98F15EE43D2DF"
    "CF62F00C92737B2FF6F59B3ABA02773314B991C41DC19ADB0AD8C17C8E26757B"
)
TIMESTAMP = 1683208172339052800
APP_HASH = "662f8c20a335f170bd60abc1f02ad66f0c6a6ee285da2a53c95259e7937c0ae9"
META = bytes.fromhex(
    "127FA211B2514F0E974A055392946DC1A14052182A6ABEFB8A6CD7C51DA1BF2E"
    "40595D28EF1A9488797C297EED3AAC45430005FB3A7F037BDD9FC4BD99F59E63"
)
TOPIC = dos.ProtectedTopic("pubsub-topic", PUBLIC)


def _vector_message(**changes):
    fields = dict(payload=PAYLOAD, content_topic="content-topic", timestamp=TIMESTAMP, ephemeral=True, meta=META)
    fields.update(changes)
    return WakuMessage(**fields)


def test_app_message_hash_matches_spec_vector():
    assert dos.app_message_hash("pubsub-topic", _vector_message()).hex() == APP_HASH


def test_signing_reproduces_spec_meta_deterministically():
    assert dos.sign_message(PRIVATE, "pubsub-topic", _vector_message(meta=b"")) == META


def test_spec_vector_is_accepted():
    assert dos.validate(TOPIC, _vector_message(), now_ns=TIMESTAMP) is dos.Verdict.ACCEPT


@pytest.mark.parametrize(
    ("message", "verdict"),
    [
        (_vector_message(timestamp=0), dos.Verdict.NO_TIMESTAMP),
        (_vector_message(meta=b""), dos.Verdict.NO_SIGNATURE),
        (_vector_message(meta=META[:63]), dos.Verdict.BAD_SIGNATURE_SIZE),
        (_vector_message(payload=PAYLOAD[:-1]), dos.Verdict.BAD_SIGNATURE),
        (_vector_message(ephemeral=False), dos.Verdict.BAD_SIGNATURE),
        (_vector_message(meta=bytes(64)), dos.Verdict.BAD_SIGNATURE),
    ],
)
def test_relay_validator_rejections(message, verdict):
    assert dos.validate(TOPIC, message, now_ns=TIMESTAMP) is verdict


def test_message_outside_window_is_rejected():
    late = TIMESTAMP + dos.DEFAULT_MESSAGE_WINDOW_NS + 1
    assert dos.validate(TOPIC, _vector_message(), now_ns=late) is dos.Verdict.OUTSIDE_WINDOW


def test_compressed_key_verifies_too():
    import coincurve

    compressed = coincurve.PublicKey(PUBLIC).format(compressed=True)
    topic = dos.ProtectedTopic("pubsub-topic", compressed)
    assert dos.validate(topic, _vector_message(), now_ns=TIMESTAMP) is dos.Verdict.ACCEPT


def test_wrong_key_is_rejected():
    import coincurve

    other = coincurve.PrivateKey(bytes([7] * 32)).public_key.format()
    topic = dos.ProtectedTopic("pubsub-topic", other)
    assert dos.validate(topic, _vector_message(), now_ns=TIMESTAMP) is dos.Verdict.BAD_SIGNATURE


def test_malformed_protected_key_raises_protocol_error():
    with pytest.raises(dos.DosProtectionError):
        dos.ProtectedTopic("t", b"\x04" + bytes(10))
