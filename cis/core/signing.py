"""Signed bundles: an Ed25519 signature over the exact bytes of ``manifest.json``.

The manifest lists every file of the bundle with its sha256, so one signature
over it covers them all: whoever can edit the files can rewrite the hashes, but
not sign the new manifest without the private key. ``cis export --sign KEY``
writes ``manifest.sig`` beside the manifest; ``load_bundle(path, trust=PUBKEY)``
(``cis serve --trust PUBKEY``) checks it before any hash or stage is read.

Keys are PEM files: ``cis keys DIR --name NAME --signing`` writes
``NAME.sign.pem`` (private, PKCS#8, mode 0600) and ``NAME.sign.pub.pem``
(public); Ed25519 keys from ``openssl genpkey -algorithm ed25519`` work too.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from cis.core.errors import BundleError, CisError

ALGORITHM = "ed25519"


def _key_id(public_raw: bytes) -> str:
    return hashlib.sha256(public_raw).hexdigest()[:16]


def _raw(public_key) -> bytes:
    from cryptography.hazmat.primitives import serialization as ser

    return public_key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def make_signing_key(folder: str | Path, name: str) -> tuple[Path, Path]:
    """Write NAME.sign.pem (private, 0600) and NAME.sign.pub.pem in ``folder``."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private, public = folder / f"{name}.sign.pem", folder / f"{name}.sign.pub.pem"
    private.touch(mode=0o600)
    private.chmod(0o600)
    private.write_bytes(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def load_private_key(path: str | Path):
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    if not path.is_file():
        raise CisError(
            f"{path}: signing key not found; expected an Ed25519 private key (PEM) "
            "from 'cis keys DIR --name NAME --signing'"
        )
    try:
        key = ser.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CisError(f"{path}: not an unencrypted PEM private key ({str(exc).splitlines()[0]})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise CisError(f"{path}: a {type(key).__name__}; expected an Ed25519 private key")
    return key


def load_public_key(path: str | Path):
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    path = Path(path)
    if not path.is_file():
        raise CisError(f"{path}: trusted key not found; expected an Ed25519 public key (PEM), e.g. NAME.sign.pub.pem")
    data = path.read_bytes()
    if b"PRIVATE KEY" in data:
        raise CisError(f"{path}: holds a private key; pass the public key (NAME.sign.pub.pem) to --trust")
    try:
        key = ser.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise CisError(f"{path}: not a PEM public key ({str(exc).splitlines()[0]})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise CisError(f"{path}: a {type(key).__name__}; expected an Ed25519 public key")
    return key


def signature_path(manifest: Path) -> Path:
    """Where a manifest's signature lives: beside it, ``.sig`` for ``.json`` (manifest.sig)."""
    return manifest.with_suffix(".sig")


def sign_manifest(manifest: str | Path, key_path: str | Path) -> Path:
    """Sign the manifest file's exact bytes with the private key; writes :func:`signature_path`."""
    manifest = Path(manifest)
    key = load_private_key(key_path)
    if not manifest.is_file():
        raise BundleError(f"{manifest.parent}: no {manifest.name} to sign")
    sig = key.sign(manifest.read_bytes())
    out = signature_path(manifest)
    record = {
        "algorithm": ALGORITHM,
        "key_id": _key_id(_raw(key.public_key())),
        "signature": base64.b64encode(sig).decode(),
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    return out


def verify_manifest(manifest: Path, manifest_bytes: bytes, trusted_key: str | Path) -> None:
    """Raise :class:`BundleError` (one line) unless the manifest's signature signs ``manifest_bytes``
    with ``trusted_key``."""
    from cryptography.exceptions import InvalidSignature

    key = load_public_key(trusted_key)
    root, sig_path = manifest.parent, signature_path(manifest)
    if not sig_path.is_file():
        raise BundleError(
            f"{root}: bundle is not signed (no {sig_path.name}); --trust {trusted_key} accepts only bundles "
            "signed with 'cis export --sign'"
        )
    try:
        record = json.loads(sig_path.read_text())
        if record.get("algorithm") != ALGORITHM:
            raise ValueError(f"algorithm {record.get('algorithm')!r}")
        sig = base64.b64decode(record["signature"], validate=True)
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise BundleError(
            f"{sig_path}: not a cis signature record ({exc}); expected ed25519 JSON from 'cis export --sign'"
        ) from None
    try:
        key.verify(sig, manifest_bytes)
    except InvalidSignature:
        signer = record.get("key_id", "?")
        raise BundleError(
            f"{root}: signature does not verify with the trusted key {trusted_key} (key id {_key_id(_raw(key))}; "
            f"signed by key id {signer}): the manifest was changed after signing or signed by another key"
        ) from None
