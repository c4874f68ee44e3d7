"""``cis keys DIR --name NAME``: make a CurveZMQ key pair (NAME.key public, NAME.key_secret secret).

``--allow FOLDER`` also copies the public NAME.key into a node's allow folder;
``--add PEER.key`` copies an existing public key into DIR (an allow folder);
``--signing`` makes Ed25519 bundle-signing keys instead (NAME.sign.pem private,
NAME.sign.pub.pem public) for ``cis export --sign`` and ``cis serve --trust``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cis.cli.main import print_result
from cis.core.errors import CisError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("keys", help="make CurveZMQ key pairs (encrypted, authenticated serving) or bundle-signing keys")
    p.add_argument("folder", help="folder to write the keys into")
    p.add_argument("--name", action="append", help="key pair name (repeatable; default 'node')")
    p.add_argument("--allow", metavar="FOLDER", help="also copy each new public key (only) into this allow folder")
    p.add_argument(
        "--add",
        action="append",
        metavar="KEYFILE",
        help="copy this public .key into FOLDER (an allow folder); repeatable",
    )
    p.add_argument(
        "--signing", action="store_true", help="make Ed25519 bundle-signing keys (NAME.sign.pem, NAME.sign.pub.pem)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cis.runtime.security import add_public, make_keys

    if args.add:
        if args.name or args.allow or args.signing:
            raise CisError("keys --add copies existing public keys; it takes no --name, --allow or --signing")
        _check_elsewhere(args.folder, args.add)
        added = [str(add_public(args.folder, f)) for f in args.add]
        print_result(args, {"added": added}, "\n".join(f"authorised: {a}" for a in added))
        return 0
    if args.signing and args.allow:
        raise CisError("--allow is for CurveZMQ keys; signing keys go to 'cis export --sign' and 'cis serve --trust'")
    names = args.name or ["node"]
    _check_new(args.folder, names, args.signing)
    if args.allow and Path(args.allow).resolve() == Path(args.folder).resolve():
        raise CisError(f"--allow {args.allow} is FOLDER itself, where the public keys are made; expected a node's "
                       "allow folder elsewhere")
    made = {}
    for name in names:
        if args.signing:
            from cis.core.signing import make_signing_key

            private, public = make_signing_key(args.folder, name)
            made[name] = {"public": str(public), "private": str(private)}
            continue
        public, secret = make_keys(args.folder, name)
        made[name] = {"public": str(public), "secret": str(secret)}
        if args.allow:
            made[name]["allowed"] = str(add_public(args.allow, public))
    if args.signing:
        lines = [f"{n}: private {v['private']}  public {v['public']}" for n, v in made.items()]
        lines.append(
            "sign bundles with 'cis export --sign PRIVATE'; serve them with 'cis serve --trust PUBLIC'; "
            "keep the private key private"
        )
    else:
        lines = [
            f"{n}: public {v['public']}  secret {v['secret']}"
            + (f"  (public copied to {v['allowed']})" if "allowed" in v else "")
            for n, v in made.items()
        ]
        lines.append(
            "authorise a peer with 'cis keys ALLOW_DIR --add PEER.key' (public key only); "
            "keep .key_secret files private"
        )
    print_result(args, {"keys": made}, "\n".join(lines))
    return 0


def _check_new(folder: str, names: list[str], signing: bool) -> None:
    """Before anything is written: each name a plain file name, and no key of that name in ``folder`` already (a
    new pair would replace it silently, and the peers that trust the old public key would lose their access)."""
    for name in names:
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise CisError(f"--name {name!r}; expected a plain file name (no '/', not starting with '.')")
        files = (f"{name}.sign.pem", f"{name}.sign.pub.pem") if signing else (f"{name}.key", f"{name}.key_secret")
        there = [f for f in files if (Path(folder) / f).exists()]
        if there:
            raise CisError(f"{Path(folder) / there[0]} exists; expected a new name or folder (keys are never replaced)")


def _check_elsewhere(folder: str, keys: list[str]) -> None:
    """Before anything is copied: no ``--add`` key already in ``folder`` (it would be copied onto itself)."""
    for key in keys:
        if Path(key).resolve().parent == Path(folder).resolve():
            raise CisError(f"--add {key}: already in {folder}; expected a peer's public key from another folder")
