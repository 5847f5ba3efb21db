"""Hashes and secp256k1 primitives shared by the protocol families.

keccak256 is the pre-standard Keccak (Ethereum's), not SHA3-256.
"""

import hashlib
from typing import Any, cast

import coincurve
from Crypto.Hash import keccak as _keccak

from wakustore.protocols.errors import ProtocolError

SECP256K1_PRIVATE_KEY_SIZE = 32
SECP256K1_COMPRESSED_SIZE = 33
SECP256K1_UNCOMPRESSED_SIZE = 65


def keccak256(data: bytes) -> bytes:
    if _keccak_oneshot is None or not isinstance(data, bytes):
        return _keccak.new(digest_bits=256, data=data).digest()
    out = _ffi.new("uint8_t[32]")
    if _keccak_oneshot(data, len(data), out, _KECCAK256_SIZE, _KECCAK256_CAPACITY, _KECCAK_ROUNDS, _KECCAK_PADDING):
        raise ValueError("keccak failed")
    return cast(bytes, _ffi.buffer(out)[:])


def _load_keccak_oneshot() -> tuple[Any, Any]:
    """pycryptodome's one-call Keccak, without the hash object, the state
    allocation and the three calls that :func:`keccak256` cost otherwise
    (6 us against 3 us for a kilobyte: once per message an archive
    export signs or checks). None where this pycryptodome has none."""
    try:
        from Crypto.Hash.keccak import _raw_keccak_lib
        from Crypto.Util._raw_api import backend, ffi

        if backend != "cffi":
            return None, None
        return _raw_keccak_lib.keccak_oneshot, ffi
    except (ImportError, AttributeError):
        return None, None


_keccak_oneshot, _ffi = _load_keccak_oneshot()
_KECCAK256_SIZE = 32
_KECCAK256_CAPACITY = 2 * _KECCAK256_SIZE  # bytes; Keccak-256 (pre-standard padding 0x01, not SHA3's 0x06)
_KECCAK_ROUNDS = 24
_KECCAK_PADDING = 0x01


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def public_key_from_bytes(raw: bytes) -> coincurve.PublicKey:
    """Parse a compressed (33) or uncompressed (65) secp256k1 public key."""
    if len(raw) not in (SECP256K1_COMPRESSED_SIZE, SECP256K1_UNCOMPRESSED_SIZE):
        raise ProtocolError(f"public key must be 33 or 65 bytes, got {len(raw)}")
    try:
        return coincurve.PublicKey(raw)
    except ValueError as exc:
        raise ProtocolError(f"invalid secp256k1 public key: {exc}") from None


def private_key_from_bytes(raw: bytes) -> coincurve.PrivateKey:
    if len(raw) != SECP256K1_PRIVATE_KEY_SIZE:
        raise ProtocolError(f"private key must be 32 bytes, got {len(raw)}")
    try:
        return coincurve.PrivateKey(raw)
    except ValueError as exc:
        raise ProtocolError(f"invalid secp256k1 private key: {exc}") from None


def compressed_public_key(raw: bytes) -> bytes:
    return public_key_from_bytes(raw).format(compressed=True)


def sign_recoverable(private_key: bytes, digest: bytes) -> bytes:
    """65-byte R||S||V signature (V in {0, 1}) over a 32-byte digest."""
    key = private_key_from_bytes(private_key)
    return key.sign_recoverable(digest, hasher=None)


def recover_public_key(signature: bytes, digest: bytes) -> bytes:
    """Recover the 33-byte compressed signer key of a 65-byte R||S||V signature."""
    if len(signature) != 65:
        raise ProtocolError(f"recoverable signature must be 65 bytes, got {len(signature)}")
    if signature[64] > 3:
        raise ProtocolError("recoverable signature has an invalid recovery id")
    try:
        key = coincurve.PublicKey.from_signature_and_message(signature, digest, hasher=None)
    except ValueError as exc:
        raise ProtocolError(f"signature does not recover a key: {exc}") from None
    return key.format(compressed=True)


def sign_compact(private_key: bytes, digest: bytes) -> bytes:
    """64-byte R||S ECDSA signature (RFC 6979, low S) over a 32-byte digest."""
    key = private_key_from_bytes(private_key)
    return key.sign_recoverable(digest, hasher=None)[:64]


def verify_compact(public_key: bytes, signature: bytes, digest: bytes) -> bool:
    """Check a 64-byte R||S signature; False for any malformed input."""
    if len(signature) != 64 or len(digest) != 32:
        return False
    try:
        key = public_key_from_bytes(public_key)
        der = coincurve.ecdsa.cdata_to_der(coincurve.ecdsa.deserialize_compact(signature))
        return key.verify(der, digest, hasher=None)
    except (ValueError, ProtocolError, TypeError):
        return False
