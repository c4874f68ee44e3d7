#!/usr/bin/env bash
# Build deploy/Dockerfile.cpu with buildah on a machine that cannot pull the python:3.12-slim base, and serve a
# node from the image (docs/deploy.md, "What was checked here"). A stand-in base is made from Debian's packages:
# mmdebstrap (bookworm: python3 3.11, python3-venv, python3-pip, passwd), tagged as
# docker.io/library/python:3.11-slim and built with --build-arg PYTHON=3.11. Then, as root:
#   - the image: user 10001, entry point cis, cis --version, no torch;
#   - a node served from it (the spec and bundle mounted, CIS_* variables as cis deploy kubernetes sets them)
#     answers /readyz and requests from this machine;
#   - the bundle image of cis deploy kubernetes --bundle-volume image, built from its Dockerfile.bundle; its init
#     container's copy (cp -R /bundle/. /mnt/bundle/) gives a folder that cis inspect verifies.
# Needs: apt-get install buildah mmdebstrap; .venv with cis (for the bundle and the client); the package index.
# CA_BUNDLE=FILE mounts FILE as the build's CA certificates (a machine whose TLS goes through a proxy of its own).
set -euo pipefail
cd "$(dirname "$0")/.."
work="${WORK:-/tmp/cis-image-check}"
bd=(buildah --storage-driver vfs)
mkdir -p "$work"
mounts=()
if [ -n "${CA_BUNDLE:-}" ]; then
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$work/pip.conf"
    mounts=(-v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" -v "$work/pip.conf:/etc/pip.conf:ro")
fi
if ! "${bd[@]}" images -q docker.io/library/python:3.11-slim | grep -q .; then
    [ -f "$work/rootfs.tar" ] || mmdebstrap --variant=apt --include=python3,python3-venv,python3-pip,passwd,ca-certificates \
        bookworm "$work/rootfs.tar"
    ctr=$("${bd[@]}" from scratch)
    "${bd[@]}" add "$ctr" "$work/rootfs.tar" / >/dev/null
    "${bd[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$ctr"
    "${bd[@]}" commit -q "$ctr" docker.io/library/python:3.11-slim
    "${bd[@]}" rm "$ctr" >/dev/null
fi
"${bd[@]}" build --pull=never --isolation chroot --network host "${mounts[@]}" --build-arg PYTHON=3.11 \
    -f deploy/Dockerfile.cpu -t cis-inference:0.1.0-cpu .
"${bd[@]}" inspect --format '{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}' cis-inference:0.1.0-cpu
[ -d "$work/fx/bundle" ] || .venv/bin/python -c "from cis.exporter.fixture_bundle import make_demo_bundle as m; m('$work/fx', steps=20)"
.venv/bin/python -c "from cis.core.bundle import load_bundle as l; from cis.core.spec import write_spec as w; w(l('$work/fx/bundle').spec, '$work/spec.toml')"
ctr=$("${bd[@]}" from --pull-never cis-inference:0.1.0-cpu)
trap '"${bd[@]}" rm "$ctr" >/dev/null 2>&1 || true' EXIT
"${bd[@]}" run --isolation chroot "$ctr" -- sh -c 'id && cis --version && python -c "import importlib.util as u; assert u.find_spec(\"torch\") is None; print(\"no torch\")"'
timeout 300 "${bd[@]}" run --isolation chroot --network host -v "$work/fx/bundle:/bundle:ro" -v "$work/spec.toml:/etc/cis/spec.toml:ro" \
    -e CIS_NODE=cloud -e CIS_SPEC=/etc/cis/spec.toml -e 'CIS_BIND=tcp://*:25570' -e CIS_METRICS_PORT=29170 \
    -e CIS_LOG_FORMAT=json "$ctr" -- cis serve /bundle > "$work/serve.log" 2>&1 &
node=$!
for _ in $(seq 240); do curl -sf localhost:29170/readyz && break; sleep 0.5; done
echo
.venv/bin/python - <<'PY'
from cis.runtime.client import Client
from cis.training.data.loading import load_dataset
x = load_dataset("digits", seed=0).test.x[:32]
with Client("tcp://127.0.0.1:25570", timeout=20) as c:
    r = c.infer(x)
print("answered", len(r), "by", sorted(set(r.served_by)), "degraded", int(r.degraded.sum()))
PY
kill "$node" 2>/dev/null || true
wait || true
rm -rf "$work/k8s" "$work/pod-bundle" && mkdir -m 777 "$work/pod-bundle"
.venv/bin/cis deploy kubernetes "$work/spec.toml" "$work/fx/bundle" -o "$work/k8s" >/dev/null
image=$(python3 -c "import json; print(json.load(open('$work/k8s/deploy.json'))['bundle_image'])")
"${bd[@]}" build --pull=never --isolation chroot -f "$work/k8s/Dockerfile.bundle" -t "$image" "$work/fx/bundle"
b=$("${bd[@]}" from --pull-never "$image")
"${bd[@]}" run --isolation chroot -v "$work/pod-bundle:/mnt/bundle" "$b" -- cp -R /bundle/. /mnt/bundle/
"${bd[@]}" rm "$b" >/dev/null
.venv/bin/cis inspect "$work/pod-bundle" | head -1
