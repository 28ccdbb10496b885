"""SHA256withRSA (PKCS#1 v1.5) and RSA key handling shared by Alipay RSA2 and WeChat Pay v3.

Both providers sign with the same primitive; they differ only in the message that is signed.
Keys are accepted as PEM (PKCS#1 or PKCS#8 private keys, SubjectPublicKeyInfo or PKCS#1 public
keys) or as the bare base64 body without the ``-----BEGIN`` lines, the form Alipay's key tool and
console hand out.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from dueflow.exceptions import ConfigError

KEY_BITS = 2048
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class KeyPair:
    """An RSA key pair, for tests and the simulator (production keys come from settings)."""

    private_key: rsa.RSAPrivateKey

    @property
    def public_key(self) -> rsa.RSAPublicKey:
        """The public half."""
        return self.private_key.public_key()

    def private_pem(self) -> str:
        """The private key as PKCS#8 PEM."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode("ascii")

    def public_pem(self) -> str:
        """The public key as SubjectPublicKeyInfo PEM."""
        return public_key_pem(self.public_key)

    def private_base64(self) -> str:
        """The private key as bare base64 of its PKCS#8 DER (Alipay's "PKCS8" form)."""
        der = self.private_key.private_bytes(
            serialization.Encoding.DER,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return base64.b64encode(der).decode("ascii")

    def public_base64(self) -> str:
        """The public key as bare base64 of its SubjectPublicKeyInfo DER (Alipay's form)."""
        der = self.public_key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return base64.b64encode(der).decode("ascii")


def generate_keypair(bits: int = KEY_BITS) -> KeyPair:
    """A fresh RSA key pair (public exponent 65537).

    Args:
        bits: The modulus size; both providers use 2048.

    Returns:
        The new key pair.
    """
    return KeyPair(rsa.generate_private_key(public_exponent=65537, key_size=bits))


def public_key_pem(key: rsa.RSAPublicKey) -> str:
    """A public key as SubjectPublicKeyInfo PEM."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def load_private_key(text: str | bytes) -> rsa.RSAPrivateKey:
    """An RSA private key from PEM or from bare base64 DER (PKCS#8 or PKCS#1).

    Raises:
        ConfigError: The text is not an unencrypted RSA private key.
    """
    try:
        if _is_pem(text):
            key: object = serialization.load_pem_private_key(_as_bytes(text), password=None)
        else:
            key = serialization.load_der_private_key(_bare_der(text), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"not an RSA private key: {exc}") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ConfigError("the private key is not an RSA key")
    return key


def load_public_key(text: str | bytes) -> rsa.RSAPublicKey:
    """An RSA public key from PEM or from bare base64 DER (SubjectPublicKeyInfo or PKCS#1).

    Raises:
        ConfigError: The text is not an RSA public key.
    """
    try:
        if _is_pem(text):
            key: object = serialization.load_pem_public_key(_as_bytes(text))
        else:
            key = serialization.load_der_public_key(_bare_der(text))
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"not an RSA public key: {exc}") from None
    if not isinstance(key, rsa.RSAPublicKey):
        raise ConfigError("the public key is not an RSA key")
    return key


def sign_sha256(private_key: rsa.RSAPrivateKey, message: bytes) -> str:
    """SHA256withRSA (PKCS#1 v1.5) over ``message``, base64 encoded without line breaks."""
    signature = private_key.sign(message, padding.PKCS1v15(), hashes.SHA256())
    return base64.b64encode(signature).decode("ascii")


def verify_sha256(public_key: rsa.RSAPublicKey, message: bytes, signature_b64: str) -> bool:
    """Whether ``signature_b64`` is a valid SHA256withRSA signature of ``message``.

    An undecodable signature is simply not valid: this never raises for bad input.
    """
    try:
        signature = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        public_key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
    except InvalidSignature:
        return False
    return True


def as_public_key(key: rsa.RSAPublicKey | rsa.RSAPrivateKey) -> rsa.RSAPublicKey:
    """The public key itself, or the public half of a private key."""
    if isinstance(key, rsa.RSAPrivateKey):
        return key.public_key()
    return key


def _is_pem(text: str | bytes) -> bool:
    return b"-----BEGIN" in _as_bytes(text)


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("ascii") if isinstance(text, str) else text


def _bare_der(text: str | bytes) -> bytes:
    compact = _WHITESPACE.sub("", text.decode("ascii") if isinstance(text, bytes) else text)
    try:
        return base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64: {exc}") from None
