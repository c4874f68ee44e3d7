"""CurveZMQ keys and allow-lists.

``cis keys DIR --name NAME`` writes NAME.key (public) and NAME.key_secret
(public + secret) in ZeroMQ's certificate format; ``--allow FOLDER`` copies only
the public NAME.key into an allow folder, ``cis keys FOLDER --add PEER.key``
copies a peer's public key there (a file that holds a secret key is refused).
A node started with a secret key encrypts its ROUTER socket; with an allow-list
folder (public ``*.key`` files) a ThreadAuthenticator refuses every peer whose
public key is not in it. Peers that are refused get no reply at all (the
handshake fails).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from cis.core.errors import CisError
from cis.runtime.node_config import CurveConfig  # noqa: F401  (callers import it from here too)

log = logging.getLogger(__name__)


def make_keys(folder: str | Path, name: str) -> tuple[Path, Path]:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(folder, name)
    Path(secret).chmod(0o600)
    return Path(public), Path(secret)


def add_public(folder: str | Path, key_file: str | Path) -> Path:
    """Copy a public ``.key`` certificate into an allow folder; refuse one that holds a secret key."""
    key_file, folder = Path(key_file), Path(folder)
    load_public(key_file)  # a readable certificate
    if zmq.auth.load_certificate(key_file)[1] is not None:
        raise CisError(
            f"{key_file}: holds a secret key; an allow folder takes only public .key files "
            "(the peer keeps its .key_secret)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    name = key_file.name if key_file.suffix == ".key" else key_file.name + ".key"
    return Path(shutil.copyfile(key_file, folder / name))


def _certificate(path: Path, expected: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None) from a ZeroMQ certificate file, which should be ``expected`` made by 'cis keys'."""
    if not path.is_file():
        raise CisError(f"{path}: key file not found; expected {expected} made by 'cis keys'")
    try:
        return zmq.auth.load_certificate(path)
    except Exception as exc:
        raise CisError(f"{path}: not a ZeroMQ certificate ({exc})") from None


def load_keypair(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file."""
    path = Path(path)
    public, secret = _certificate(path, "a .key_secret file")
    if secret is None:
        raise CisError(f"{path}: holds no secret key; expected the .key_secret file")
    return public, secret


def load_public(path: str | Path) -> bytes:
    return _certificate(Path(path), "a public .key file")[0]


def start_authenticator(
    ctx: zmq.Context, allow_dir: str | Path, own_secret: str | Path | None = None
) -> ThreadAuthenticator:
    """Refuse every peer whose public key is not in ``allow_dir``, except peers holding the
    node's own key pair (``own_secret``): the other nodes of one ``cis serve --all``, which
    share it, and whoever holds that secret could pose as the node anyway."""
    folder = Path(allow_dir)
    if not folder.is_dir():
        raise CisError(f"{folder}: allow-list folder not found; expected a folder of public .key files")
    leaked = sorted(p.name for p in folder.glob("*.key_secret"))
    if leaked:
        log.warning(
            "%s holds secret keys (%s); an allow folder needs only public .key files",
            folder,
            ", ".join(leaked),
        )
    own = load_keypair(own_secret)[0] if own_secret else None
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(folder))
    if own is not None:
        auth.certs.setdefault("*", {})[own] = True
    return auth


def secure_server(sock: zmq.Socket, cfg: CurveConfig) -> None:
    if not cfg.enabled:
        return
    public, secret = load_keypair(cfg.secret_file)  # type: ignore[arg-type]
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def secure_client(sock: zmq.Socket, cfg: CurveConfig) -> None:
    if not cfg.enabled:
        return
    if cfg.server_public_file is None:
        raise CisError("curve: a client key was given without the server's public key (--server-key)")
    public, secret = load_keypair(cfg.secret_file)  # type: ignore[arg-type]
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = load_public(cfg.server_public_file)
