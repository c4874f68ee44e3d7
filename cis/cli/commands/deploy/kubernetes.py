"""Kubernetes manifests from a spec and a bundle: per node a Deployment (``replicas`` from the spec) and a
Service, the spec as a ConfigMap, the bundle as a volume. docs/deploy.md, *Kubernetes*, says what each field
is for; tests/test_deploy.py validates every object against the Kubernetes API schema.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from cis.cli.commands.deploy.plan import Endpoint, log_env, serve_env
from cis.cli.commands.deploy.resources import Resources
from cis.core.errors import CisError
from cis.core.spec import CisSpec, Node
from cis.core.version import __version__

BUNDLE_VOLUMES = ("image", "pvc", "hostpath")
BUNDLE_DIR = "/bundle"  # where the container sees the bundle
SPEC_DIR = "/etc/cis"  # the ConfigMap's spec.toml
IMAGE_UID = 10001  # the non-root user of the images (deploy/Dockerfile.cpu, .gpu)
LABEL = "cis-inference.io"  # the prefix of cis's own labels and annotations
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # a DNS-1035 label: what a Service name must be
_DOMAIN_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # an RFC 1123 label, as Kubernetes takes it


@dataclass(frozen=True)
class KubeOptions:
    namespace: str = "cis"
    prefix: str = "cis"  # object names: PREFIX-NODE; the instance label
    image_cpu: str = f"cis-inference:{__version__}-cpu"
    image_gpu: str = f"cis-inference:{__version__}-gpu"
    bundle_volume: str = "image"
    bundle_image: str | None = None  # image mode; default cis-inference-bundle:SHA12
    bundle_claim: str | None = None  # pvc mode; default PREFIX-bundle
    bundle_path: str | None = None  # hostpath mode; default /srv/cis/bundles/SHA12
    metrics_port: int = 9100
    cluster_domain: str = "cluster.local"
    selectors: dict[str, dict[str, str]] = field(default_factory=dict)  # exit number or node id -> labels
    sets: dict[str, str] = field(default_factory=dict)  # --set: serve options of every node


def object_names(spec: CisSpec, prefix: str) -> dict[str, str]:
    """Each node's object name, PREFIX-ID made a DNS label (lower case; ``_`` and ``.`` become ``-``)."""
    if not _NAME.fullmatch(prefix) or len(prefix) > 40:
        raise CisError(f"--name {prefix!r}; expected a DNS label: lower-case letters, digits and '-', starting with "
                       "a letter, at most 40 characters")
    out: dict[str, str] = {}
    for n in spec.nodes:
        name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", f"{prefix}-{n.id}".lower())).strip("-")
        if not _NAME.fullmatch(name) or len(name) > 63:
            raise CisError(
                f"node {n.id!r}: object name {name!r} is not a DNS label; expected at most 63 letters, digits and '-' "
                "starting with a letter (pick a shorter --name or node id)"
            )
        if name in out.values():
            other = next(i for i, v in out.items() if v == name)
            raise CisError(f"nodes {other!r} and {n.id!r} both make the object name {name!r}; rename one")
        out[n.id] = name
    return out


def check_domain(domain: str) -> None:
    """``--cluster-domain``: a DNS name (RFC 1123 labels), since it goes into every child's parent address."""
    if len(domain) > 253 or not all(_DOMAIN_LABEL.fullmatch(label) for label in domain.split(".")):
        raise CisError(f"--cluster-domain {domain!r}; expected a DNS name: dot-separated labels of lower-case "
                       "letters, digits and '-' (e.g. cluster.local)")


def service_address(name: str, options: KubeOptions, port: int) -> str:
    """Where a child finds its parent: the parent's Service, whose ready replicas share the connections."""
    return f"tcp://{name}.{options.namespace}.svc.{options.cluster_domain}:{port}"


def parse_selectors(items: list[str], spec: CisSpec) -> dict[str, dict[str, str]]:
    """``--node-selector WHERE:KEY=VALUE``: WHERE an exit number (a tier) or a node id."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        where, _, label = item.partition(":")
        key, eq, value = label.partition("=")
        tiers = {str(e) for e in range(1, spec.num_exits + 1)}
        if not eq or not key or (where not in tiers and where not in spec.ids):
            raise CisError(
                f"--node-selector {item!r}; expected WHERE:KEY=VALUE, WHERE an exit 1..{spec.num_exits} or a node "
                f"id ({', '.join(spec.ids)}), e.g. 1:kubernetes.io/arch=arm64"
            )
        out.setdefault(where, {})[key] = value
    return out


def manifests(
    spec: CisSpec,
    spec_text: str,
    bundle_sha256: str,
    ends: dict[str, Endpoint],
    resources: dict[str, Resources],
    options: KubeOptions,
) -> dict[str, list[dict]]:
    """{file name: objects}: the namespace, the spec's ConfigMap, and per node its Deployment and Service."""
    names = object_names(spec, options.prefix)
    if not _NAME.fullmatch(options.namespace) or len(options.namespace) > 63:
        raise CisError(f"--namespace {options.namespace!r}; expected a DNS label: lower-case letters, digits and '-', "
                       "starting with a letter")
    files: dict[str, list[dict]] = {}
    if options.namespace != "default":
        namespace = {"name": options.namespace, "labels": _common(options)}
        files["00-namespace.yaml"] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": namespace}]
    config = {"name": f"{options.prefix}-spec", "namespace": options.namespace, "labels": _common(options)}
    files["01-spec.yaml"] = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": config, "data": {"spec.toml": spec_text}}
    ]
    stamps = {  # a new bundle or spec changes the pod template: a rolling update
        f"{LABEL}/bundle-sha256": bundle_sha256,
        f"{LABEL}/spec-sha256": hashlib.sha256(spec_text.encode()).hexdigest(),
    }
    for n in spec.nodes:
        parent = None if n.parent is None else service_address(names[n.parent], options, ends[n.parent].port)
        container = _container(n, parent, ends[n.id].port, resources[n.id], options)
        pod = _pod(n, names[n.id], container, resources[n.id], bundle_sha256, options)
        files[f"node-{names[n.id]}.yaml"] = [
            _deployment(n, names[n.id], pod, stamps, options),
            _service(n, names[n.id], ends[n.id].port, options),
        ]
    return files


def _common(options: KubeOptions) -> dict[str, str]:
    return {"app.kubernetes.io/name": "cis", "app.kubernetes.io/instance": options.prefix}


def _selector(name: str, options: KubeOptions) -> dict[str, str]:
    """What picks a node's pods (a Deployment's selector cannot change: no version in it)."""
    return {"app.kubernetes.io/instance": options.prefix, f"{LABEL}/node": name}


def _deployment(node: Node, name: str, pod: dict, stamps: dict[str, str], options: KubeOptions) -> dict:
    labels = {**_common(options), **_selector(name, options), f"{LABEL}/tier": str(node.exit)}
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(options.metrics_port),
        "prometheus.io/path": "/metrics",
        **stamps,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": options.namespace, "labels": labels},
        "spec": {
            "replicas": node.replicas,
            "selector": {"matchLabels": _selector(name, options)},
            # a new pod is ready before an old one goes: a node keeps serving through an update
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    "labels": {**labels, "app.kubernetes.io/version": __version__},
                    "annotations": annotations,
                },
                "spec": pod,
            },
        },
    }


def _service(node: Node, name: str, port: int, options: KubeOptions) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {**_common(options), **_selector(name, options), f"{LABEL}/tier": str(node.exit)},
        },
        "spec": {
            "selector": _selector(name, options),
            "ports": [
                {"name": k, "port": v, "targetPort": k, "protocol": "TCP"} for k, v in _ports(port, options).items()
            ],
        },
    }


def _container(node: Node, parent: str | None, port: int, res: Resources, options: KubeOptions) -> dict:
    """``cis serve /bundle`` with the node's CIS_* variables, its ports, probes and resources."""
    env = {
        **serve_env(node, f"tcp://*:{port}", parent, f"{SPEC_DIR}/spec.toml", options.metrics_port, options.sets),
        **log_env("json"),
    }
    probe = {"httpGet": {"path": "/livez", "port": "metrics"}}
    return {
        "name": "cis",
        "image": options.image_gpu if res.gpus else options.image_cpu,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cis"],
        "args": ["serve", BUNDLE_DIR],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": k, "containerPort": v, "protocol": "TCP"} for k, v in _ports(port, options).items()],
        # docs/runtime.md, "Metrics and health": loading is alive but not ready; a stall restarts the container
        "startupProbe": {**probe, "periodSeconds": 5, "failureThreshold": 60},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 6},
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 5},
        "resources": _resources(res),
        "securityContext": _container_security(),
        "volumeMounts": [
            {"name": "bundle", "mountPath": BUNDLE_DIR, "readOnly": True},
            {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _ports(port: int, options: KubeOptions) -> dict[str, int]:
    """The node's named ports: ZeroMQ, metrics, and the front doors that ``--set http_port=``/``grpc_port=`` open."""
    doors = {door: int(options.sets[f"{door}_port"]) for door in ("http", "grpc") if f"{door}_port" in options.sets}
    for door, number in doors.items():
        if not 0 < number < 65536:
            raise CisError(f"--set {door}_port={number}; expected a port 1..65535 (a pod's port is fixed)")
    return {"zmq": port, "metrics": options.metrics_port, **doors}


def door_notes(sets: dict[str, str]) -> list[str]:
    """A front door that ``--set`` opens but that binds loopback in its pod (serve's default host): the Service
    cannot reach it."""
    if sets.get("http_host"):
        return []
    shut = [d for d in ("http", "grpc") if f"{d}_port" in sets
            and not (sets.get(f"{d}_tls_cert") and sets.get("auth_token_file"))]  # TLS and a token: every interface
    return [
        f"--set {d}_port={sets[f'{d}_port']}: the door binds 127.0.0.1 in each pod, which its Service cannot reach; "
        "add --set http_host=0.0.0.0 (or TLS and a token: docs/runtime.md, Open Inference Protocol)"
        for d in shut
    ]


def _pod(node: Node, name: str, container: dict, res: Resources, sha: str, options: KubeOptions) -> dict:
    pod: dict = {
        "enableServiceLinks": False,  # no PREFIX_NODE_PORT=... variables: CIS_* names are serve's options
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 20,  # SIGTERM: a node drains for at most 10 s
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [_bundle_volume(sha, options), _spec_volume(options), {"name": "tmp", "emptyDir": {}}],
        "affinity": _affinity(node, name, options),
    }
    if options.bundle_volume == "image":
        pod["initContainers"] = [_bundle_copier(sha, options)]
    selector = {**options.selectors.get(str(node.exit), {}), **options.selectors.get(node.id, {})}
    if selector:
        pod["nodeSelector"] = selector
    if res.gpus:
        pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return pod


def _resources(res: Resources) -> dict:
    limits: dict[str, str | int] = {"memory": f"{res.memory_limit_mib}Mi"}
    if res.gpus:
        limits["nvidia.com/gpu"] = res.gpus
    return {"requests": {"cpu": f"{res.cpu_millis}m", "memory": f"{res.memory_mib}Mi"}, "limits": limits}


def _container_security() -> dict:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def bundle_image(sha: str, options: KubeOptions) -> str:
    return options.bundle_image or f"cis-inference-bundle:{sha[:12]}"


def _bundle_volume(sha: str, options: KubeOptions) -> dict:
    if options.bundle_volume == "pvc":
        claim = options.bundle_claim or f"{options.prefix}-bundle"
        return {"name": "bundle", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
    if options.bundle_volume == "hostpath":
        path = options.bundle_path or f"/srv/cis/bundles/{sha[:12]}"
        return {"name": "bundle", "hostPath": {"path": path, "type": "Directory"}}
    return {"name": "bundle", "emptyDir": {}}  # image: filled by the init container


def _bundle_copier(sha: str, options: KubeOptions) -> dict:
    """The init container of ``--bundle-volume image``: copies the bundle image's /bundle into the pod's volume."""
    return {
        "name": "bundle",
        "image": bundle_image(sha, options),
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", "-R", f"{BUNDLE_DIR}/.", "/mnt/bundle/"],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _container_security(),
        "volumeMounts": [{"name": "bundle", "mountPath": "/mnt/bundle"}],
    }


def _spec_volume(options: KubeOptions) -> dict:
    return {"name": "spec", "configMap": {"name": f"{options.prefix}-spec"}}


def _affinity(node: Node, name: str, options: KubeOptions) -> dict:
    """Prefer the machines labelled with the node's tier; spread a node's replicas over machines."""
    tier = {"key": f"{LABEL}/tier", "operator": "In", "values": [str(node.exit)]}
    preferred = [{"weight": 100, "preference": {"matchExpressions": [tier]}}]
    out: dict = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}
    if node.replicas > 1:
        term = {"labelSelector": {"matchLabels": _selector(name, options)}, "topologyKey": "kubernetes.io/hostname"}
        out["podAntiAffinity"] = {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    return out
