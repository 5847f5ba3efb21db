"""The generated protobuf modules: in sync with their sources, and on-wire correct.

Expected bytes below are written out by hand from the protobuf encoding rules
(tag = field_number << 3 | wire_type, varints little-endian base 128, sint64
zigzag) so a wrong field number, type or packing shows up as a byte mismatch.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import unknown_fields

from wakustore.protos import (
    application_metadata_pb2,
    archive_magnetlink_pb2,
    archive_spec_pb2,
    archive_status_go_pb2,
    chat_identity_pb2,
    community_description_pb2,
    generate,
    lightpush_legacy_pb2,
    lightpush_v3_pb2,
    store_legacy_pb2,
    store_v3_pb2,
    waku_message_pb2,
    waku_metadata_pb2,
)

PROTO_DIR = Path(generate.__file__).resolve().parent


def roundtrip(message):
    """Encode, decode into a fresh instance, and check both agree."""
    data = message.SerializeToString()
    decoded = type(message).FromString(data)
    assert decoded == message
    assert decoded.SerializeToString() == data
    return decoded


def unknown(message) -> list[tuple[int, int, object]]:
    return [(f.field_number, f.wire_type, f.data) for f in unknown_fields.UnknownFieldSet(message)]


# --------------------------------------------------------------------------
# Generated code is in sync with the .proto sources


def test_committed_modules_match_a_fresh_build():
    result = subprocess.run(
        [sys.executable, "-m", "wakustore.protos.generate", "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (
        "generated protobuf modules drifted from the .proto sources; run "
        "`python -m wakustore.protos.generate`\n" + result.stdout + result.stderr
    )


def test_script_form_runs_too():
    result = subprocess.run(
        [sys.executable, str(PROTO_DIR / "generate.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_proto_has_importable_modules():
    sources = sorted(p.stem for p in PROTO_DIR.glob("*.proto"))
    assert sources, "no .proto sources found"
    for stem in sources:
        assert (PROTO_DIR / f"{stem}_pb2.py").is_file()
        assert (PROTO_DIR / f"{stem}_pb2.pyi").is_file()
        module = importlib.import_module(f"wakustore.protos.{stem}_pb2")
        # Registered under the virtual prefix, so the names cannot clash with
        # another package's "message.proto" in the default descriptor pool.
        assert module.DESCRIPTOR.name == f"wakustore/protos/{stem}.proto"


def test_generated_modules_import_each_other_by_package_path():
    text = (PROTO_DIR / "store_v3_pb2.py").read_text()
    assert "from wakustore.protos import waku_message_pb2" in text
    assert (
        store_v3_pb2.WakuMessageKeyValue.DESCRIPTOR.fields_by_name["message"].message_type
        is waku_message_pb2.WakuMessage.DESCRIPTOR
    )


def test_generation_is_deterministic(tmp_path):
    first = generate.compile_protos(PROTO_DIR, tmp_path / "one")
    second = generate.compile_protos(PROTO_DIR, tmp_path / "two")
    assert first == second
    assert set(first) == set(generate.generated_files(PROTO_DIR))


@pytest.fixture
def proto_copy(tmp_path):
    """A copy of the sources and generated modules to tamper with."""
    copy = tmp_path / "protos"
    copy.mkdir()
    for path in PROTO_DIR.iterdir():
        if path.name.endswith((".proto", "_pb2.py", "_pb2.pyi")):
            shutil.copy2(path, copy / path.name)
    return copy


def test_check_passes_on_an_untouched_copy(proto_copy):
    assert generate.main(["--check", "--proto-dir", str(proto_copy)]) == 0


def test_check_reports_changed_missing_and_extra(proto_copy, capsys):
    source = proto_copy / "waku_message.proto"
    source.write_text(
        source.read_text().replace(
            "optional bool ephemeral = 31;", "optional bool ephemeral = 31;\n  bytes extra = 40;"
        )
    )
    (proto_copy / "store_v3_pb2.pyi").unlink()
    (proto_copy / "gone_pb2.py").write_text("# left behind by a deleted .proto\n")

    assert generate.main(["--check", "--proto-dir", str(proto_copy)]) == 1
    err = capsys.readouterr().err
    assert "changed: waku_message_pb2.py" in err
    assert "changed: waku_message_pb2.pyi" in err
    assert "missing: store_v3_pb2.pyi" in err
    assert "extra: gone_pb2.py" in err
    assert "store_legacy_pb2.py" not in err

    # Regenerating repairs all three kinds of drift.
    assert generate.main(["--proto-dir", str(proto_copy)]) == 0
    assert not (proto_copy / "gone_pb2.py").exists()
    assert generate.main(["--check", "--proto-dir", str(proto_copy)]) == 0


# --------------------------------------------------------------------------
# 14/WAKU2-MESSAGE


def test_waku_message_wire_bytes():
    message = waku_message_pb2.WakuMessage(payload=b"\x01\x02", content_topic="/t", version=1, timestamp=1)
    # 0a 02 0102 | 12 02 "/t" | 18 01 | 50 02 (field 10 varint, zigzag(1) = 2)
    assert message.SerializeToString() == bytes.fromhex("0a02010212022f7418015002")
    roundtrip(message)


def test_waku_message_timestamp_is_zigzag_sint64_field_10():
    # zigzag(-1) = 1, zigzag(-2) = 3: a plain int64 would need ten bytes.
    assert waku_message_pb2.WakuMessage(timestamp=-1).SerializeToString() == bytes.fromhex("5001")
    assert waku_message_pb2.WakuMessage(timestamp=-2).SerializeToString() == bytes.fromhex("5003")
    # The 14/WAKU2-MESSAGE test vector's timestamp 0x175789bfa23f8400, zigzag
    # (doubled) = 0x2eaf137f447f0800, as a base-128 varint.
    ts = 0x175789BFA23F8400
    data = waku_message_pb2.WakuMessage(timestamp=ts).SerializeToString()
    assert data == bytes.fromhex("508090fca3f4efc4d72e")
    assert waku_message_pb2.WakuMessage.FromString(data).timestamp == ts


def test_waku_message_high_fields_and_presence():
    message = waku_message_pb2.WakuMessage(meta=b"\xaa", rate_limit_proof=b"\xbb", ephemeral=True)
    # meta: field 11 bytes -> 5a; proof: field 21 -> aa 01; ephemeral: field 31 varint -> f8 01
    assert message.SerializeToString() == bytes.fromhex("5a01aaaa0101bbf80101")
    roundtrip(message)

    # An empty payload is still written when set: nwaku requires field 1.
    empty = waku_message_pb2.WakuMessage(payload=b"", content_topic="x")
    assert empty.SerializeToString() == bytes.fromhex("0a00120178")
    assert empty.HasField("payload")
    assert not waku_message_pb2.WakuMessage().HasField("payload")
    assert waku_message_pb2.WakuMessage().SerializeToString() == b""
    assert waku_message_pb2.WakuMessage(ephemeral=False).SerializeToString() == bytes.fromhex("f80100")


def test_waku_message_as_nwaku_writes_it_reencodes_identically():
    # nwaku writes every field, defaults included (empty payload, version 0,
    # timestamp 0, empty meta, empty proof, ephemeral false).
    raw = bytes.fromhex("0a00120163180050005a00aa0100f80100")
    message = waku_message_pb2.WakuMessage.FromString(raw)
    assert message.content_topic == "c" and message.payload == b""
    assert message.SerializeToString() == raw


def test_waku_message_reads_js_waku_rate_limit_proof_submessage():
    # js-waku declares field 21 as a RateLimitProof message; on the wire it is
    # length-delimited like our bytes field.
    proof = bytes.fromhex("0a03010203")  # RateLimitProof{proof = 010203}
    data = bytes.fromhex("aa0105") + proof
    assert waku_message_pb2.WakuMessage.FromString(data).rate_limit_proof == proof


# --------------------------------------------------------------------------
# Store v3


def test_store_query_request_wire_bytes():
    request = store_v3_pb2.StoreQueryRequest(
        request_id="r",
        include_data=True,
        pubsub_topic="p",
        content_topics=["c"],
        time_start=-1,
        pagination_cursor=b"\x07",
        pagination_forward=True,
        pagination_limit=5,
    )
    assert request.SerializeToString() == bytes.fromhex(
        "0a0172"  # 1: request_id
        "1001"  # 2: include_data
        "520170"  # 10: pubsub_topic
        "5a0163"  # 11: content_topics
        "6001"  # 12: time_start, zigzag(-1)
        "9a030107"  # 51: cursor (tag 410)
        "a00301"  # 52: forward (tag 416)
        "a80305"  # 53: limit (tag 424)
    )
    roundtrip(request)
    hashes = store_v3_pb2.StoreQueryRequest(request_id="r", message_hashes=[b"\x01" * 32])
    assert hashes.SerializeToString()[3:6] == bytes.fromhex("a20120")  # 20: tag 162, len 32
    roundtrip(hashes)


def test_store_query_response_wire_bytes():
    entry = store_v3_pb2.WakuMessageKeyValue(
        message_hash=b"\x11" * 32,
        message=waku_message_pb2.WakuMessage(payload=b"", content_topic="c"),
        pubsub_topic="p",
    )
    response = store_v3_pb2.StoreQueryResponse(request_id="r", status_code=200, status_desc="", messages=[entry])
    data = response.SerializeToString()
    # status 200 -> 50 c801; an empty status_desc is still written (nwaku needs it).
    assert data.startswith(bytes.fromhex("0a017250c8015a00a201"))
    decoded = roundtrip(response)
    assert decoded.HasField("status_desc")
    assert not decoded.HasField("pagination_cursor")
    assert decoded.messages[0].message.HasField("payload")


# --------------------------------------------------------------------------
# Store v2 beta4 (legacy)


def test_history_response_writes_error_none():
    response = store_legacy_pb2.HistoryResponse(error=store_legacy_pb2.HistoryResponse.NONE)
    assert response.SerializeToString() == bytes.fromhex("2000")
    assert store_legacy_pb2.HistoryResponse.FromString(b"").HasField("error") is False
    assert store_legacy_pb2.HistoryResponse.TOO_MANY_RESULTS == 429
    assert store_legacy_pb2.HistoryResponse.TOO_MANY_REQUESTS == 429
    assert store_legacy_pb2.HistoryResponse.SERVICE_UNAVAILABLE == 503
    limited = store_legacy_pb2.HistoryResponse(error=store_legacy_pb2.HistoryResponse.TOO_MANY_RESULTS)
    assert limited.SerializeToString() == bytes.fromhex("20ad03")


def test_history_rpc_roundtrip_and_bytes():
    cursor = store_legacy_pb2.Index(digest=b"\x22" * 32, receiver_time=0, sender_time=-1, pubsub_topic="p")
    # Zero receiver_time is still written: nwaku requires all four fields.
    assert cursor.SerializeToString()[34:] == bytes.fromhex("10001801220170")
    query = store_legacy_pb2.HistoryQuery(
        pubsub_topic="p",
        content_filters=[store_legacy_pb2.ContentFilter(content_topic="c")],
        paging_info=store_legacy_pb2.PagingInfo(
            page_size=20,
            cursor=cursor,
            direction=store_legacy_pb2.PagingInfo.BACKWARD,
        ),
        start_time=1,
        end_time=2,
    )
    data = query.SerializeToString()
    assert data.startswith(bytes.fromhex("1201701a030a016322"))
    assert data.endswith(bytes.fromhex("28023004"))  # 5, 6: sint64 zigzag
    # Direction BACKWARD (0) is written because it was set.
    assert query.paging_info.SerializeToString().endswith(bytes.fromhex("1800"))
    rpc = store_legacy_pb2.HistoryRPC(
        request_id="id",
        query=query,
        response=store_legacy_pb2.HistoryResponse(
            messages=[waku_message_pb2.WakuMessage(payload=b"x", content_topic="c", timestamp=5)],
            paging_info=store_legacy_pb2.PagingInfo(direction=store_legacy_pb2.PagingInfo.FORWARD),
            error=store_legacy_pb2.HistoryResponse.NONE,
        ),
    )
    roundtrip(rpc)


# --------------------------------------------------------------------------
# Lightpush


def test_lightpush_legacy_bytes_and_roundtrip():
    assert lightpush_legacy_pb2.PushResponse(is_success=False).SerializeToString() == bytes.fromhex("0800")
    response = lightpush_legacy_pb2.PushResponse(is_success=True, info="ok")
    assert response.SerializeToString() == bytes.fromhex("080112026f6b")
    rpc = lightpush_legacy_pb2.PushRPC(
        request_id="a",
        request=lightpush_legacy_pb2.PushRequest(
            pubsub_topic="p", message=waku_message_pb2.WakuMessage(payload=b"", content_topic="c")
        ),
    )
    assert rpc.SerializeToString() == bytes.fromhex("0a0161120a0a017012050a00120163")
    roundtrip(rpc)
    roundtrip(lightpush_legacy_pb2.PushRPC(request_id="a", response=response))


def test_lightpush_v3_bytes_and_roundtrip():
    request = lightpush_v3_pb2.LightpushRequest(
        request_id="a",
        pubsub_topic="p",
        message=waku_message_pb2.WakuMessage(payload=b"", content_topic="c"),
    )
    # 20: tag 162 (a2 01); 21: tag 170 (aa 01)
    assert request.SerializeToString() == bytes.fromhex("0a0161a2010170aa01050a00120163")
    roundtrip(request)
    assert not lightpush_v3_pb2.LightpushRequest(request_id="a").HasField("pubsub_topic")

    response = lightpush_v3_pb2.LightpushResponse(request_id="a", status_code=200, status_desc="", relay_peer_count=0)
    assert response.SerializeToString() == bytes.fromhex("0a016150c8015a006000")
    roundtrip(response)


# --------------------------------------------------------------------------
# Metadata


def test_metadata_shards_written_unpacked_at_2_and_packed_at_3():
    shards = [32, 300]
    request = waku_metadata_pb2.WakuMetadataRequest(cluster_id=16, shards=shards, packed_shards=shards)
    assert request.SerializeToString() == bytes.fromhex(
        "0810"  # 1: cluster_id 16
        "1020"
        "10ac02"  # 2: one varint per shard (js-waku / nwaku "deprecated")
        "1a0320ac02"  # 3: packed (nwaku >= March 2024, go-waku)
    )
    roundtrip(request)
    response = waku_metadata_pb2.WakuMetadataResponse(cluster_id=0, shards=shards, packed_shards=shards)
    # cluster_id 0 is explicit (optional) and still written.
    assert response.SerializeToString().startswith(bytes.fromhex("0800"))
    roundtrip(response)


def test_metadata_reads_every_deployed_shard_encoding():
    decode = waku_metadata_pb2.WakuMetadataResponse.FromString
    js_waku = bytes.fromhex("080110201021")  # unpacked field 2
    nwaku = bytes.fromhex("081010201a0120")  # field 2 unpacked + field 3 packed
    go_waku = bytes.fromhex("08101a022021")  # field 3 packed only
    packed_2 = bytes.fromhex("081012022021")  # field 2 packed (spec proto3 default)
    assert list(decode(js_waku).shards) == [32, 33]
    assert list(decode(js_waku).packed_shards) == []
    assert list(decode(nwaku).shards) == [32] and list(decode(nwaku).packed_shards) == [32]
    assert list(decode(go_waku).packed_shards) == [32, 33] and list(decode(go_waku).shards) == []
    assert list(decode(packed_2).shards) == [32, 33]
    assert decode(b"").HasField("cluster_id") is False


# --------------------------------------------------------------------------
# 56/STATUS-COMMUNITIES


def make_description():
    member = community_description_pb2.CommunityMember(
        roles=[community_description_pb2.CommunityMember.ROLE_OWNER],
        last_update_clock=7,
    )
    chat = community_description_pb2.CommunityChat(
        members={"0xabc": member},
        permissions=community_description_pb2.CommunityPermissions(
            access=community_description_pb2.CommunityPermissions.AUTO_ACCEPT
        ),
        identity=chat_identity_pb2.ChatIdentity(display_name="general", emoji="#"),
        category_id="cat",
        position=-1,
    )
    return community_description_pb2.CommunityDescription(
        clock=42,
        members={"0xabc": member},
        permissions=community_description_pb2.CommunityPermissions(
            ens_only=False,
            private=True,
            access=community_description_pb2.CommunityPermissions.ON_REQUEST,
        ),
        identity=chat_identity_pb2.ChatIdentity(
            clock=1,
            display_name="Community",
            description="d",
            images={
                "thumbnail": chat_identity_pb2.IdentityImage(
                    payload=b"\x89PNG",
                    source_type=chat_identity_pb2.IdentityImage.RAW_PAYLOAD,
                    image_format=chat_identity_pb2.PNG,
                )
            },
            social_links=[chat_identity_pb2.SocialLink(text="web", url="https://x")],
            first_message_timestamp=1,
        ),
        chats={"chat-1": chat},
        ban_list=["0xdef"],
        categories={"cat": community_description_pb2.CommunityCategory(category_id="cat", name="C", position=2)},
        archive_magnetlink_clock=9,
        admin_settings=community_description_pb2.CommunityAdminSettings(pin_message_all_members_enabled=True),
        tags=["tag"],
        relay_shard_index=64,
        active_members_count=3,
        id="0x02ab",
        banned_members={"0xdef": community_description_pb2.CommunityBanInfo(delete_all_messages=True)},
        private_data={"k": b"v"},
    )


def test_community_description_roundtrip():
    roundtrip(make_description())


def test_community_description_field_numbers():
    assert community_description_pb2.CommunityDescription(relay_shard_index=64).SerializeToString() == bytes.fromhex(
        "7840"
    )
    assert community_description_pb2.CommunityDescription(clock=1, tags=["t"]).SerializeToString() == bytes.fromhex(
        "0801720174"
    )
    admin = community_description_pb2.CommunityDescription(
        admin_settings=community_description_pb2.CommunityAdminSettings(pin_message_all_members_enabled=True)
    )
    assert admin.SerializeToString() == bytes.fromhex("52020801")
    identity = community_description_pb2.CommunityDescription(identity=chat_identity_pb2.ChatIdentity(clock=2))
    assert identity.SerializeToString() == bytes.fromhex("2a020802")
    roles = community_description_pb2.CommunityMember(roles=[1, 4])
    assert roles.SerializeToString() == bytes.fromhex("0a020104")  # proto3 packs repeated enums
    assert (
        community_description_pb2.CommunityMember.ROLE_ALL == community_description_pb2.CommunityMember.ROLE_OWNER == 1
    )
    assert community_description_pb2.CommunityPermissions.NO_MEMBERSHIP == 1
    assert community_description_pb2.CommunityPermissions.MANUAL_ACCEPT == 3
    # 100: tag 802 = a2 06; map entry {1: "k", 2: b"v"}
    private = community_description_pb2.CommunityDescription(private_data={"k": b"v"})
    assert private.SerializeToString() == bytes.fromhex("a206060a016b120176")


def test_status_go_token_permissions_at_15_survive_as_unknown_field():
    # status-go's field 15 is map<string, CommunityTokenPermission>: a
    # length-delimited entry {key "x"}. It must neither break parsing nor be
    # read as relay_shard_index, and re-encoding keeps it.
    raw = bytes.fromhex("08017a030a0178")
    description = community_description_pb2.CommunityDescription.FromString(raw)
    assert description.clock == 1
    assert description.relay_shard_index == 0
    assert unknown(description) == [(15, 2, b"\x0a\x01x")]
    assert description.SerializeToString() == raw


def test_application_metadata_message():
    assert application_metadata_pb2.ApplicationMetadataMessage.COMMUNITY_DESCRIPTION == 25
    assert application_metadata_pb2.ApplicationMetadataMessage.COMMUNITY_MESSAGE_ARCHIVE_MAGNETLINK == 43
    wrapper = application_metadata_pb2.ApplicationMetadataMessage(
        signature=b"\x01" * 65,
        payload=b"\x08\x01",
        type=application_metadata_pb2.ApplicationMetadataMessage.COMMUNITY_MESSAGE_ARCHIVE_MAGNETLINK,
    )
    data = wrapper.SerializeToString()
    assert data[:2] == bytes.fromhex("0a41")
    assert data[67:] == bytes.fromhex("12020801182b")
    roundtrip(wrapper)
    # An unnamed type number is kept (open enum).
    other = application_metadata_pb2.ApplicationMetadataMessage.FromString(bytes.fromhex("185a"))
    assert other.type == 90
    assert other.SerializeToString() == bytes.fromhex("185a")


def test_archive_magnetlink():
    link = archive_magnetlink_pb2.CommunityMessageArchiveMagnetlink(clock=300, magnet_uri="magnet:?xt=x")
    assert link.SerializeToString() == bytes.fromhex("08ac02120c") + b"magnet:?xt=x"
    roundtrip(link)


# --------------------------------------------------------------------------
# Community history archives


def test_status_go_archive_layout():
    metadata = archive_status_go_pb2.WakuMessageArchiveMetadata(
        **{"from": 1_700_000_000, "to": 1_700_604_800}, contentTopic=[b"\xde\xad\xbe\xef"]
    )
    assert getattr(metadata, "from") == 1_700_000_000
    assert metadata.SerializeToString().endswith(bytes.fromhex("2204deadbeef"))
    message = archive_status_go_pb2.WakuMessage(
        sig=b"\x02" * 65,
        timestamp=1_700_000_001,
        topic=b"\xde\xad\xbe\xef",
        payload=b"p",
        padding=b"\x00",
        hash=b"\x03" * 32,
        thirdPartyId="t",
    )
    tail = message.SerializeToString()[67:]
    assert tail.startswith(bytes.fromhex("10"))  # 2: timestamp varint
    assert bytes.fromhex("1a04deadbeef2201702a0100") in tail
    assert tail.endswith(bytes.fromhex("3a0174"))  # 7: thirdPartyId
    archive = archive_status_go_pb2.WakuMessageArchive(metadata=metadata, messages=[message])
    roundtrip(archive)
    entry = archive_status_go_pb2.WakuMessageArchiveIndexMetadata(metadata=metadata, offset=0, size=102400, padding=100)
    # 4: size 102400 = varint 80 a0 06; 5: padding 100; offset 0 is not written
    assert entry.SerializeToString().endswith(bytes.fromhex("2080a0062864"))
    index = archive_status_go_pb2.WakuMessageArchiveIndex(archives={"0x" + "ab" * 32: entry})
    roundtrip(index)


def test_spec_archive_layout():
    metadata = archive_spec_pb2.WakuMessageArchiveMetadata(
        version=1, **{"from": 10, "to": 20}, contentTopic=["/waku/1/0xdeadbeef/rfc26"]
    )
    archive = archive_spec_pb2.WakuMessageArchive(
        version=1,
        metadata=metadata,
        messages=[waku_message_pb2.WakuMessage(payload=b"p", content_topic="/waku/1/0xdeadbeef/rfc26", timestamp=15)],
        padding=b"\x00" * 5,
    )
    data = archive.SerializeToString()
    assert data.endswith(bytes.fromhex("2205") + b"\x00" * 5)  # 4: padding inside the protobuf
    roundtrip(archive)
    entry = archive_spec_pb2.WakuMessageArchiveIndexMetadata(metadata=metadata, offset=1, num_pieces=2)
    assert entry.SerializeToString().endswith(bytes.fromhex("18012002"))
    roundtrip(archive_spec_pb2.WakuMessageArchiveIndex(archives={"k": entry}))


def test_archive_layouts_do_not_read_each_other():
    raw_topics = archive_status_go_pb2.WakuMessageArchiveMetadata(contentTopic=[b"\xff\xfe\x00\x01"])
    with pytest.raises(Exception):  # noqa: B017  (protobuf's DecodeError, or a UnicodeDecodeError)
        archive_spec_pb2.WakuMessageArchiveMetadata.FromString(raw_topics.SerializeToString())
    # A status-go archive message read as 14/WAKU2-MESSAGE: sig lands in
    # payload, the uint64 timestamp at 2 cannot be a string and is left unknown.
    status_go = archive_status_go_pb2.WakuMessage(sig=b"s", timestamp=5)
    as_waku = waku_message_pb2.WakuMessage.FromString(status_go.SerializeToString())
    assert as_waku.payload == b"s"
    assert as_waku.content_topic == ""
    assert unknown(as_waku) == [(2, 0, 5)]
