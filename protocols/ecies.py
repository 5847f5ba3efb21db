"""ECIES as RLPx uses it (go-ethereum ``crypto/ecies`` with secp256k1).

Parameters are go-ethereum's ``ECIES_AES128_SHA256``, the ones it picks for
secp256k1 keys:

- key agreement: secp256k1 ECDH; the shared secret ``z`` is the raw
  32-byte X coordinate of the product point (no hashing);
- key derivation: NIST SP 800-56 concatenation KDF with SHA-256 and no
  shared info, ``K = SHA256(00000001 || z)``; ``Ke = K[:16]`` is the
  AES-128 key and ``Km = SHA256(K[16:32])`` the HMAC key;
- cipher: AES-128-CTR with a random 16-byte IV;
- tag: HMAC-SHA256(Km, iv || ciphertext || shared_mac_data).

Output: ``0x04 || ephemeral public key (64) || iv (16) || ciphertext || tag (32)``.
RLPx (EIP-8) passes the 2-byte big-endian packet size prefix as
``shared_mac_data``; the pre-EIP-8 handshake passes nothing.

Every malformed or unauthenticated input raises
:class:`~wakustore.protocols.errors.RLPxError`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import coincurve
from Crypto.Cipher import AES

from wakustore.protocols.errors import RLPxError

# Sizes (go-ethereum crypto/ecies/params.go ECIES_AES128_SHA256 and
# p2p/rlpx/rlpx.go eciesOverhead = 65 + 16 + 32).
PUBLIC_KEY_SIZE = 64  # X || Y, the uncompressed key without its 0x04 tag
UNCOMPRESSED_KEY_SIZE = 65
PRIVATE_KEY_SIZE = 32
SHARED_SECRET_SIZE = 32  # the X coordinate of the ECDH point
AES_KEY_SIZE = 16  # AES-128
IV_SIZE = 16  # one AES block
TAG_SIZE = 32  # HMAC-SHA256
ECIES_OVERHEAD = UNCOMPRESSED_KEY_SIZE + IV_SIZE + TAG_SIZE

_KDF_COUNTER = (1).to_bytes(4, "big")


def encrypt(
    public_key: bytes,
    plaintext: bytes,
    shared_mac_data: bytes = b"",
    *,
    ephemeral_key: bytes | None = None,
    iv: bytes | None = None,
) -> bytes:
    """Encrypt ``plaintext`` (at least one byte) to a secp256k1 ``public_key``.

    ``public_key`` is 64 bytes (X || Y) or 65 (with the 0x04 tag).
    ``ephemeral_key`` (32 bytes) and ``iv`` (16 bytes) are random unless
    given; fixing them is only meant for reproducible tests. The result is
    ``len(plaintext) + ECIES_OVERHEAD`` bytes long.
    """
    if not plaintext:
        # go-ethereum's Encrypt returns nothing for an empty message.
        raise RLPxError("ecies: empty plaintext")
    remote = parse_public_key(public_key)
    ephemeral = coincurve.PrivateKey(
        ephemeral_key if ephemeral_key is not None else secrets.token_bytes(PRIVATE_KEY_SIZE)
    )
    if iv is None:
        iv = secrets.token_bytes(IV_SIZE)
    elif len(iv) != IV_SIZE:
        raise ValueError(f"iv must be {IV_SIZE} bytes")
    enc_key, mac_key = _derive_keys(_shared_x(ephemeral, remote))
    body = iv + _aes128_ctr(enc_key, iv, plaintext)
    tag = hmac.new(mac_key, body + shared_mac_data, hashlib.sha256).digest()
    return ephemeral.public_key.format(compressed=False) + body + tag


def decrypt(private_key: bytes, ciphertext: bytes, shared_mac_data: bytes = b"") -> bytes:
    """Check the tag and decrypt; raises :class:`RLPxError` on any failure.

    The tag is compared in constant time before anything is decrypted.
    """
    if len(ciphertext) <= ECIES_OVERHEAD:
        raise RLPxError(f"ecies: ciphertext of {len(ciphertext)} bytes is too short")
    if ciphertext[0] != 0x04:
        # go-ethereum only ever writes uncompressed ephemeral keys.
        raise RLPxError("ecies: ephemeral key is not an uncompressed point")
    ephemeral = parse_public_key(ciphertext[:UNCOMPRESSED_KEY_SIZE])
    own = _private_key(private_key)
    enc_key, mac_key = _derive_keys(_shared_x(own, ephemeral))
    body = ciphertext[UNCOMPRESSED_KEY_SIZE:-TAG_SIZE]
    tag = hmac.new(mac_key, body + shared_mac_data, hashlib.sha256).digest()
    if not hmac.compare_digest(tag, ciphertext[-TAG_SIZE:]):
        raise RLPxError("ecies: bad message tag")
    return _aes128_ctr(enc_key, body[:IV_SIZE], body[IV_SIZE:])


def ecdh_x(private_key: bytes, public_key: bytes) -> bytes:
    """The raw 32-byte X coordinate of ``private_key * public_key``.

    go-ethereum's ``GenerateShared``; coincurve's own ``ecdh`` would hash it.
    """
    return _shared_x(_private_key(private_key), parse_public_key(public_key))


def parse_public_key(raw: bytes) -> coincurve.PublicKey:
    """A 64-byte (X || Y) or 65-byte (0x04 || X || Y) point on secp256k1."""
    if len(raw) == PUBLIC_KEY_SIZE:
        raw = b"\x04" + bytes(raw)
    if len(raw) != UNCOMPRESSED_KEY_SIZE or raw[0] != 0x04:
        raise RLPxError(f"invalid public key of {len(raw)} bytes (expect 64/65)")
    try:
        return coincurve.PublicKey(bytes(raw))
    except ValueError:
        raise RLPxError("public key is not a point on secp256k1") from None


def public_key_of(private_key: bytes) -> bytes:
    """The 64-byte public key (X || Y, the devp2p node id) of a private key."""
    return _private_key(private_key).public_key.format(compressed=False)[1:]


def _private_key(raw: bytes) -> coincurve.PrivateKey:
    if len(raw) != PRIVATE_KEY_SIZE:
        raise ValueError(f"private key must be {PRIVATE_KEY_SIZE} bytes")
    try:
        return coincurve.PrivateKey(bytes(raw))
    except ValueError:
        raise ValueError("private key is out of range for secp256k1") from None


def _shared_x(private: coincurve.PrivateKey, public: coincurve.PublicKey) -> bytes:
    # secp256k1 has prime order and the scalar is in [1, n-1], so the product
    # of a valid point is never the point at infinity.
    point = public.multiply(private.secret)
    return point.format(compressed=False)[1 : 1 + SHARED_SECRET_SIZE]


def _derive_keys(shared_x: bytes) -> tuple[bytes, bytes]:
    # concatKDF needs 32 bytes: exactly one SHA-256 block, counter 1.
    derived = hashlib.sha256(_KDF_COUNTER + shared_x).digest()
    enc_key = derived[:AES_KEY_SIZE]
    mac_key = hashlib.sha256(derived[AES_KEY_SIZE:]).digest()
    return enc_key, mac_key


def _aes128_ctr(key: bytes, iv: bytes, data: bytes) -> bytes:
    # Go's cipher.NewCTR counts the whole 16-byte block as one big-endian integer.
    cipher = AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=iv)
    return cipher.encrypt(data)
