"""``cis deploy kubernetes SPEC BUNDLE -o DIR`` and ``cis deploy systemd SPEC -o DIR``: deployment files from a
spec (no torch). docs/deploy.md walks both, and the container images (deploy/Dockerfile.cpu, .gpu).

The kit beside this command:

- :mod:`.plan`: what every target shares: each node's endpoint, the address it binds and its parent's, and the
  ``cis serve`` options it runs with (``CIS_*`` variables: serve's own table, :mod:`cis.cli.commands.serve_config`);
- :mod:`.resources`: CPU and memory per node from the bundle's latency profile and the rate calculus;
- :mod:`.kubernetes`: a Deployment and a Service per node, the spec as a ConfigMap, the bundle as a volume;
- :mod:`.systemd`: the ``cis-node@.service`` template unit and one environment file per node;
- :mod:`.yaml_text` (YAML without a YAML library) and :mod:`.files` (the output folder and its record).

It lives in the command layer because what it writes is ``cis serve``'s own interface (its flags and ``CIS_*``
variables); it needs no torch (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path
from typing import Any

from cis.cli.commands.deploy import files, plan
from cis.cli.commands.deploy.kubernetes import BUNDLE_VOLUMES, IMAGE_UID, KubeOptions, check_domain
from cis.cli.commands.deploy.systemd import UnitOptions
from cis.cli.main import print_result
from cis.core.bundle import Bundle, load_bundle
from cis.core.errors import CisError
from cis.core.spec import CisSpec, dumps_spec, load_spec

TARGETS = ("kubernetes", "systemd")
KUBE_ONLY = ("namespace", "name", "image_cpu", "image_gpu", "bundle_volume", "bundle_image", "bundle_claim",
             "node_selector", "headroom", "cluster_domain")
SYSTEMD_ONLY = ("cis", "env_dir", "user")


# (flag, metavar, help) of each target's own options; each defaults to None, so run() can refuse it for the other
KUBE_FLAGS = (
    ("--namespace", "NS", "namespace of every object (default cis)"),
    ("--name", "PREFIX", "object names PREFIX-NODE and the instance label (default cis)"),
    ("--image-cpu", "IMAGE", f"image of the cpu nodes (default cis-inference:VERSION-cpu; user {IMAGE_UID})"),
    ("--image-gpu", "IMAGE", "image of the nodes whose provider is cuda or tensorrt (default "
     "cis-inference:VERSION-gpu)"),
    ("--bundle-image", "IMAGE", "--bundle-volume image: the bundle image (default cis-inference-bundle:SHA12)"),
    ("--bundle-claim", "CLAIM", "--bundle-volume pvc: the claim's name (default PREFIX-bundle)"),
    ("--cluster-domain", "DOMAIN", "the cluster's DNS domain (default cluster.local)"),
)
SYSTEMD_FLAGS = (
    ("--cis", "PATH", "the cis command on the machines (default /opt/cis/bin/cis)"),
    ("--env-dir", "DIR", "where NODE.env and spec.toml go on the machines (default /etc/cis)"),
    ("--user", "USER", "the user the nodes run as (default cis)"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deploy",
        help="deployment files from a spec: Kubernetes manifests, or systemd units (docs/deploy.md)",
        description="kubernetes SPEC BUNDLE -o DIR: a Deployment and a Service per node, the spec as a ConfigMap, the "
        "bundle as a volume. systemd SPEC [BUNDLE] -o DIR: the cis-node@.service template and one environment file "
        "per node. Every node needs its address (tcp://HOST:PORT) in the spec.",
    )
    p.add_argument("target", metavar="TARGET", help="kubernetes or systemd")
    p.add_argument("spec", metavar="SPEC", help="the CIS spec (TOML), every node with its address")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE",
                   help="the bundle (kubernetes: required; systemd: optional, checked against the spec)")
    p.add_argument("-o", "--out", required=True, metavar="DIR",
                   help="folder to write (new, empty, or an earlier cis deploy's)")
    p.add_argument("--metrics-port", type=int, default=plan.DEFAULT_METRICS_PORT, metavar="PORT",
                   help="each node's /metrics, /livez, /readyz port (systemd: node i of the spec gets PORT+i)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a cis serve option every node runs with, e.g. max_batch=16 (repeatable)")
    p.add_argument("--bundle-path", metavar="PATH",
                   help="systemd: the bundle's folder on the machines (default /srv/cis/bundle); kubernetes with "
                   "--bundle-volume hostpath: the folder on every machine (default /srv/cis/bundles/SHA12)")
    p.add_argument("--json", action="store_true", help="print the result (the files written) as JSON")
    k = p.add_argument_group("kubernetes")
    for flag, metavar, text in KUBE_FLAGS:
        k.add_argument(flag, metavar=metavar, help=text)
    k.add_argument("--bundle-volume", choices=BUNDLE_VOLUMES,
                   help="how pods get the bundle: image (default: an init container copies it from a bundle image), "
                   "pvc (a claim you fill), hostpath (a folder on every machine)")
    k.add_argument("--node-selector", action="append", metavar="WHERE:KEY=VALUE",
                   help="a machine label the pods of a tier (WHERE: an exit number) or a node (its id) require, "
                   "e.g. 1:kubernetes.io/arch=arm64 (repeatable)")
    k.add_argument("--headroom", type=float, metavar="FACTOR",
                   help="CPU request = FACTOR x the node's expected load (default 2)")
    s = p.add_argument_group("systemd")
    for flag, metavar, text in SYSTEMD_FLAGS:
        s.add_argument(flag, metavar=metavar, help=text)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.target not in TARGETS:
        raise CisError(f"unknown target {args.target!r}; expected one of {', '.join(TARGETS)}")
    other = KUBE_ONLY if args.target == "systemd" else SYSTEMD_ONLY
    given = [o for o in other if getattr(args, o) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise CisError(f"{flag} is an option of cis deploy {TARGETS[args.target == 'kubernetes']}, not {args.target}")
    if not 0 < args.metrics_port < 65536:
        raise CisError(f"--metrics-port {args.metrics_port}; expected a port 1..65535")
    if args.cluster_domain is not None:  # "" too: not the default in disguise
        check_domain(args.cluster_domain)
    spec = load_spec(args.spec)
    ends = plan.endpoints(spec, args.spec)
    sets = plan.parse_sets(args.set)
    if args.target == "kubernetes" and args.bundle is None:
        raise CisError("cis deploy kubernetes needs the bundle: cis deploy kubernetes SPEC BUNDLE -o DIR")
    bundle = None if args.bundle is None else load_bundle(args.bundle)
    if bundle is not None:
        plan.check_bundle(spec, bundle, args.spec)
    make = _kubernetes if args.target == "kubernetes" else _systemd
    texts, result, human = make(args, spec, bundle, ends, sets)
    out = Path(args.out)
    files.prepare(out)
    result = files.write(out, texts, {"target": args.target, "spec": str(Path(args.spec).resolve()), **result})
    print_result(args, result, "\n".join([*human, f"wrote {len(result['files'])} files to {result['out']}",
                                          *(f"note: {n}" for n in result["notes"])]))
    return 0


def _spec_text(spec: CisSpec, source: str) -> str:
    """The spec the deployed processes read. Each of them serves its node as one process (``cis serve --node
    ID``; a Deployment's pods are its replicas, a unit runs one), so every node says ``replicas = 1`` there: with
    N, ``--node ID`` would name no process (``ID#i`` would), and the replicas' addresses are the platform's."""
    nodes = (dataclasses.replace(n, replicas=1, addresses=None, address=n.address or (n.addresses or (None,))[0])
             for n in spec.nodes)  # fmt: skip
    return (f"# the spec of this deployment, from {Path(source).name} (written by cis deploy; each node served as "
            "one process: replicas are the platform's)\n" + dumps_spec(spec.replace_nodes(nodes)))


def _kubernetes(
    args: argparse.Namespace, spec: CisSpec, bundle: Bundle | None, ends: dict[str, plan.Endpoint], sets: dict
) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    from cis.cli.commands.deploy import kubernetes
    from cis.cli.commands.deploy.resources import node_resources
    from cis.cli.commands.deploy.yaml_text import dump_all

    assert bundle is not None
    headroom = 2.0 if args.headroom is None else args.headroom
    if not (math.isfinite(headroom) and headroom > 0):
        raise CisError(f"--headroom {args.headroom}; expected a finite number > 0")
    if args.bundle_path is not None and not args.bundle_path.startswith("/"):
        raise CisError(f"--bundle-path {args.bundle_path!r} is relative; expected an absolute path on the machines "
                       "(a hostPath volume)")
    volume = args.bundle_volume or "image"
    for flag, mode in (("bundle_image", "image"), ("bundle_claim", "pvc"), ("bundle_path", "hostpath")):
        if getattr(args, flag) is not None and volume != mode:
            raise CisError(f"--{flag.replace('_', '-')} goes with --bundle-volume {mode}, not {volume}")
    named = ("namespace", "image_cpu", "image_gpu", "bundle_volume", "bundle_image", "bundle_claim", "bundle_path",
             "cluster_domain")
    given = {k: getattr(args, k) for k in named if getattr(args, k) is not None}
    for k, v in given.items():  # an empty value is a mistake, not the default
        if not str(v).strip():
            raise CisError(f"--{k.replace('_', '-')} {v!r} is empty; expected a value, or the flag left out for its "
                           "default")
    options = KubeOptions(**given, prefix=args.name or "cis", metrics_port=args.metrics_port, sets=sets,
                          selectors=kubernetes.parse_selectors(args.node_selector or [], spec))
    resources, notes = node_resources(spec, bundle, headroom, sets)
    notes += kubernetes.door_notes(sets)
    objects = kubernetes.manifests(spec, _spec_text(spec, args.spec), bundle.sha256, ends, resources, options)
    texts = {name: dump_all(docs) for name, docs in objects.items()}
    image = kubernetes.bundle_image(bundle.sha256, options)
    if options.bundle_volume == "image":
        texts["Dockerfile.bundle"] = _bundle_dockerfile(options.image_cpu, image)
    names = kubernetes.object_names(spec, options.prefix)
    nodes = {
        n.id: {
            "name": names[n.id],
            "exit": n.exit,
            "replicas": n.replicas,
            "address": kubernetes.service_address(names[n.id], options, ends[n.id].port),
            "image": options.image_gpu if resources[n.id].gpus else options.image_cpu,
            **resources[n.id].to_json(),
        }
        for n in spec.nodes
    }
    result = {"bundle": str(bundle.root.resolve()), "bundle_sha256": bundle.sha256, "namespace": options.namespace,
              "bundle_volume": options.bundle_volume, "bundle_image": image if volume == "image" else None,
              "nodes": nodes, "notes": notes}
    human = [f"cis deploy kubernetes: spec {spec.name!r} ({len(spec.nodes)} nodes), bundle {bundle.sha256[:12]}, "
             f"namespace {options.namespace}, bundle volume {options.bundle_volume}",
             f"{'node':<12}{'replicas':>9}{'cpu':>8}{'memory':>9}{'gpu':>5}  image"]
    human += [f"{i:<12}{d['replicas']:>9}{d['cpu']:>8}{d['memory']:>9}{d['gpus']:>5}  {d['image']}"
              for i, d in nodes.items()]
    return texts, result, human


def _bundle_dockerfile(base: str, image: str) -> str:
    return f"""\
# The bundle as an image (cis deploy kubernetes --bundle-volume image): each pod's init container copies its
# /bundle into the pod. Build it with the bundle folder as the context (docs/deploy.md, "The bundle"):
#   podman build -f Dockerfile.bundle -t {image} BUNDLE
FROM {base}
COPY --chown={IMAGE_UID}:{IMAGE_UID} . /bundle/
"""


def _systemd(
    args: argparse.Namespace, spec: CisSpec, bundle: Bundle | None, ends: dict[str, plan.Endpoint], sets: dict
) -> tuple[dict[str, str], dict[str, Any], list[str]]:
    from cis.cli.commands.deploy.systemd import UNIT, check_ids, check_options, env_files, unit_text

    check_ids(spec)
    given = {k: getattr(args, k) for k in ("cis", "env_dir", "bundle_path", "user") if getattr(args, k) is not None}
    options = UnitOptions(**given, metrics_port=args.metrics_port, sets=sets)
    check_options(options)
    if options.metrics_port + len(spec.nodes) - 1 > 65535:
        raise CisError(f"--metrics-port {options.metrics_port}: node i of the spec gets PORT+i, past 65535")
    texts = {UNIT: unit_text(options), "spec.toml": _spec_text(spec, args.spec), **env_files(spec, ends, options)}
    nodes = {
        n.id: {"exit": n.exit, "replicas": n.replicas, "bind": ends[n.id].bind(),
               "parent": None if n.parent is None else str(ends[n.parent]), "metrics_port": options.metrics_port + i,
               "env_file": f"{options.env_dir}/{n.id}.env", "unit": f"cis-node@{n.id}.service"}
        for i, n in enumerate(spec.nodes)
    }
    notes = [
        f"node {n.id!r} has replicas = {n.replicas}; a unit runs one process per node, at its address (the first "
        "of 'addresses'): systemd does not start the other replicas"
        for n in spec.nodes if n.replicas > 1
    ]
    result = {"bundle": None if bundle is None else str(bundle.root.resolve()), "env_dir": options.env_dir,
              "bundle_path": options.bundle_path, "nodes": nodes, "notes": notes}
    human = [f"cis deploy systemd: spec {spec.name!r} ({len(spec.nodes)} nodes); on each machine: "
             f"{options.env_dir}/NODE.env, {options.env_dir}/spec.toml, /etc/systemd/system/{UNIT}",
             f"{'node':<12}{'bind':<24}{'metrics':>8}  parent"]
    human += [f"{i:<12}{d['bind']:<24}{d['metrics_port']:>8}  {d['parent'] or '-'}" for i, d in nodes.items()]
    return texts, result, human
