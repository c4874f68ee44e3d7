"""Signed bundles and key hygiene: ``cis keys --signing/--allow/--add``, ``cis export --sign``,
``cis serve --trust`` refusing an unsigned, re-hashed or wrongly signed bundle with one line."""

from __future__ import annotations

import json

import pytest

from cis.core.bundle import BundleError, load_bundle, sha256_file, sign_bundle, write_manifest
from cis.core.errors import CisError
from cis.core.signing import make_signing_key


@pytest.fixture
def bundle(tmp_path):
    root = tmp_path / "bundle"
    (root / "stages").mkdir(parents=True)
    (root / "stages" / "stage1.onnx").write_bytes(b"graph bytes")
    write_manifest(root, {"stages": [], "model": {"name": "toy"}})
    return root


@pytest.fixture
def keys(tmp_path):
    return make_signing_key(tmp_path / "keys", "release"), make_signing_key(tmp_path / "keys", "other")


def test_a_signed_bundle_loads_under_its_key(bundle, keys):
    (private, public), _ = keys
    sig = sign_bundle(bundle, private)
    assert json.loads(sig.read_text())["algorithm"] == "ed25519"
    assert load_bundle(bundle, trust=public).manifest["model"]["name"] == "toy"
    assert (private.stat().st_mode & 0o777) == 0o600


def test_unsigned_rehashed_or_wrongly_signed_bundles_are_refused(bundle, keys):
    (private, public), (other_private, other_public) = keys
    with pytest.raises(BundleError, match="not signed"):
        load_bundle(bundle, trust=public)
    sign_bundle(bundle, other_private)
    with pytest.raises(BundleError, match="does not verify"):
        load_bundle(bundle, trust=public)
    sign_bundle(bundle, private)
    # whoever can edit the files can rewrite the hashes, but not the signature
    stage = bundle / "stages" / "stage1.onnx"
    stage.write_bytes(b"evil graph")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["stages/stage1.onnx"] = sha256_file(stage)
    (bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert load_bundle(bundle).manifest["model"]["name"] == "toy"  # the hashes alone are satisfied
    with pytest.raises(BundleError, match="does not verify"):
        load_bundle(bundle, trust=public)
    (bundle / "manifest.sig").write_text("not json")
    with pytest.raises(BundleError, match="not a cis signature record"):
        load_bundle(bundle, trust=public)
    with pytest.raises(CisError, match="holds a private key"):
        load_bundle(bundle, trust=private)


def test_serve_trust_refuses_with_one_line(bundle, keys, run_cli):
    (private, public), (other_private, _) = keys
    res = run_cli("serve", bundle, "--node", "cloud", "--trust", public)
    assert res.code == 2 and "not signed" in res.err and len(res.err.strip().splitlines()) == 1
    sign_bundle(bundle, other_private)
    res = run_cli("serve", bundle, "--all", "--trust", public)
    assert res.code == 2 and "does not verify" in res.err and len(res.err.strip().splitlines()) == 1


def test_export_sign_checks_the_key_before_exporting(tmp_path, run_cli):
    res = run_cli("export", tmp_path / "no-run", "--out", tmp_path / "b", "--sign", tmp_path / "missing.pem")
    assert res.code == 2 and "signing key not found" in res.err
    public = make_signing_key(tmp_path, "k")[1]
    res = run_cli("export", tmp_path / "no-run", "--out", tmp_path / "b", "--sign", public)
    assert res.code == 2 and "private key" in res.err and not (tmp_path / "b").exists()


def test_keys_write_only_public_keys_into_an_allow_folder(tmp_path, run_cli):
    res = run_cli("keys", tmp_path / "clients", "--name", "phone", "--allow", tmp_path / "allow", "--json")
    assert res.code == 0, res.err
    assert sorted(p.name for p in (tmp_path / "allow").iterdir()) == ["phone.key"]
    assert (tmp_path / "clients" / "phone.key_secret").is_file()
    res = run_cli("keys", tmp_path / "allow", "--add", tmp_path / "clients" / "phone.key_secret")
    assert res.code == 2 and "secret key" in res.err
    run_cli("keys", tmp_path / "other", "--name", "tablet")
    assert run_cli("keys", tmp_path / "allow", "--add", tmp_path / "other" / "tablet.key").code == 0
    assert sorted(p.name for p in (tmp_path / "allow").iterdir()) == ["phone.key", "tablet.key"]
    res = run_cli("keys", tmp_path / "sign", "--name", "release", "--signing", "--json")
    assert res.code == 0 and sorted(p.name for p in (tmp_path / "sign").iterdir()) == [
        "release.sign.pem",
        "release.sign.pub.pem",
    ]
