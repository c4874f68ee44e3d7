"""What a simulation run is asked to do: ``SimConfig``, checked once up front."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from cis.core.errors import CisError
from cis.core.faults import Fault, check_faults
from cis.core.policy.threshold_range import THRESHOLD_EXPECTED, is_threshold
from cis.core.seeds import MAX_SEED, is_seed
from cis.core.spec import CisSpec, Node
from cis.runtime.node_config import heartbeat_timeout, node_default
from cis.sim.arrivals import ARRIVALS

SERVICES = ("exponential", "deterministic")
WIRES = ("payload", "tcp")
RUNTIME_MAX_BATCH = node_default("max_batch")  # cis serve --max-batch's default
DEFAULT_SERVICE_MEAN = 0.005  # seconds per stage on a speed-1 node, without a bundle
DEFAULT_PAYLOAD_BYTES = 3072 * 4  # a 32x32x3 float32 image, without a bundle


@dataclass(frozen=True)
class SimConfig:
    """One run. Exactly one of ``requests`` (stop after that many arrivals) and
    ``duration`` (stop arrivals after that many simulated seconds) is set; the
    requests in flight then drain, so every arrival is served or dropped."""

    requests: int | None = None
    duration: float | None = None
    seed: int = 0
    arrivals: str = "poisson"  # poisson | deterministic | mmpp | trace
    trace: str | None = None  # the trace file when arrivals == "trace"
    mmpp_ratio: float = 4.0  # busy rate / quiet rate
    mmpp_dwell: float = 1.0  # mean seconds in each state
    service: str | None = None  # exponential | deterministic; None: deterministic with a bundle, else exponential
    service_mean: float = DEFAULT_SERVICE_MEAN
    payload_bytes: int = DEFAULT_PAYLOAD_BYTES
    shares: dict[str, float] = field(default_factory=dict)  # without a bundle: served share per node (default f_i)
    burst: float | None = None  # token bucket depth in seconds of the cap; None: the policy's default
    calibrate: bool = False  # recalibrate thresholds from the profile instead of the bundle's policy
    threshold: float | None = None  # with a bundle: every non-root node's threshold (cis serve --all --threshold)
    # The real runtime on one machine (bench/sim_vs_runtime.py, cis demo): with ``loopback``
    # links carry no latency and no bandwidth limit; each node visit costs one messaging round
    # trip (ZeroMQ + Python + the OS waking a process: the client's or child's message in, the
    # reply out), drawn uniformly from ``hop_rtt`` once per request for all its visits (seconds;
    # one value: a constant; empty: none),
    # half on the way in and half on the way back; and ``visit_overhead`` seconds of node work
    # on top of the stage times (decode, batching, policy, encode), holding the worker.
    # bench/sim_vs_runtime.py and cis demo fill ``hop_rtt`` with the per-visit costs of a
    # calibration load on the running cluster (cis.sim.calibration.calibrate_visits: messaging and node
    # work together) and leave ``visit_overhead`` at 0.
    loopback: bool = False
    hop_rtt: tuple[float, ...] = ()
    # The client's own messaging (its request to the entry node, the answer back), drawn once per request
    # from ``entry_rtt`` and paid on the entry visit in place of a ``hop_rtt`` (empty: hop_rtt's draw): a
    # request pays its client's send and receive once, and a node-to-node hop per forward.
    entry_rtt: tuple[float, ...] = ()
    visit_overhead: float = 0.0
    # Node work per micro-batch on top of its stages, holding the worker (per node id; "*": every node not
    # named): what a runtime node's batch costs beyond the profiled stage calls (the exit decision, the
    # answers and the forward sent, and the stage's weights coming back into the caches). Seconds, or a
    # table ((idle seconds, seconds), ...) by how long the node idled before the batch (0: it was busy),
    # linear between the points and flat beyond them: a node that slept finds its caches cold.
    batch_overhead: dict[str, float | tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # Seconds of a node's own core for each message that reaches it while one of its batches runs (every node):
    # the batch runs that much longer per message (ZeroMQ's I/O thread and the kernel receive it on the node's
    # core beside the batch, and the node reads it before its next batch). 0: messages cost the node nothing.
    message_work: float = 0.0
    # Seconds per call of each stage by batch size, {stage: {batch: seconds}} (the bundle's
    # profiles/latency.json format), measured where the nodes run; None: the bundle's profile.
    latency_profile: dict[int, dict[int, float]] | None = None
    # A node takes longer over the batch that ends an idle time (its process must be woken, the
    # core's caches and clock went cold): ((idle seconds, extra seconds), ...), linear between the
    # points, flat beyond them. Empty: never.
    idle_slowdown: tuple[tuple[float, float], ...] = ()
    # How a stage's time spreads around its mean (measured: each call's time over the mean): one
    # multiplier drawn at random per batch instead of the service distribution's. Empty: none.
    service_spread: tuple[float, ...] = ()
    # The cores of one machine slow each other (shared caches and memory; on a virtual machine the physical
    # cores under it): while m other cores run batches, a batch advances 1 + interference * m times slower
    # (cis.sim.cores). Every node of the run counts as on one machine (a loopback or testbed run); 0: independent.
    interference: float = 0.0
    # Micro-batches (cis serve --max-batch): a free worker takes up to max_batch waiting requests
    # at once; None: the runtime's 32 with a bundle (its latency profile has batch times), 1 without.
    max_batch: int | None = None
    # What a forward puts on a link: "payload" (the carry; replies travel free) or "tcp" (the
    # runtime's message, header included, in TCP/IPv4/Ethernet segments; replies cross the link
    # too). link_burst: bytes a link may send at once after idling (tc tbf's burst; 0: none).
    wire: str = "payload"
    link_burst: float = 0.0
    # Scheduled link faults (cis.core.faults) and the runtime's timers that decide what a fault costs:
    # a forward waits forward_timeout per tier above; a child pings its parent every heartbeat s
    # and calls it down once a ping stayed unanswered for heartbeat_timeout s (None: cis serve's rule,
    # max(1, 5 x heartbeat)); TCP retries a lost segment after rto s, doubling.
    faults: tuple[Fault, ...] = ()
    forward_timeout: float = node_default("forward_timeout")
    heartbeat: float = node_default("heartbeat")
    heartbeat_timeout: float | None = None
    rto: float = 0.2
    # Record each request's visit per node as spans (queue, compute, forward, request: cis.sim.spans), the
    # runtime's tracing kinds; off: nothing recorded.
    spans: bool = False
    progress: bool = False

    def to_json(self) -> dict:
        """The config recorded next to the results (the progress bar is no part of a result)."""
        data = asdict(self)
        del data["progress"]
        return data


def check_config(config: SimConfig, spec: CisSpec, with_bundle: bool) -> SimConfig:
    """Raise a one-line :class:`CisError` for a config that cannot run; return it with defaults resolved."""
    _check_load(config, spec)
    _check_costs(config)
    _check_batches(config, spec)
    _check_links(config, spec)
    max_batch = config.max_batch or (RUNTIME_MAX_BATCH if with_bundle else 1)
    service = config.service or ("deterministic" if with_bundle else "exponential")
    if service not in SERVICES:
        raise CisError(f"simulate: --service is {service!r}; expected one of {', '.join(SERVICES)}")
    _check_decision(config, spec, with_bundle)
    return replace(
        config, service=service, max_batch=max_batch, hop_rtt=tuple(float(v) for v in config.hop_rtt),
        entry_rtt=tuple(float(v) for v in config.entry_rtt),
        faults=tuple(sorted(config.faults, key=lambda f: f.at)),
        idle_slowdown=tuple((float(g), float(f)) for g, f in config.idle_slowdown),
        service_spread=tuple(float(v) for v in config.service_spread),
        heartbeat_timeout=run_heartbeat_timeout(config),
    )


def _check_load(config: SimConfig, spec: CisSpec) -> None:
    """When arrivals stop, and how they come."""
    if not is_seed(config.seed):
        raise CisError(f"simulate: --seed is {config.seed!r}; expected an integer in 0..{MAX_SEED}")
    if (config.requests is None) == (config.duration is None):
        raise CisError("simulate: give exactly one of --requests N or --duration SECONDS")
    if config.requests is not None and config.requests < 1:
        raise CisError(f"simulate: --requests is {config.requests}; expected an integer >= 1")
    if config.duration is not None and not (math.isfinite(config.duration) and config.duration > 0):
        raise CisError(f"simulate: --duration is {config.duration}; expected seconds > 0")
    if config.arrivals not in (*ARRIVALS, "trace"):
        raise CisError(
            f"simulate: --arrivals is {config.arrivals!r}; expected one of {', '.join(ARRIVALS)} or trace:FILE"
        )
    if config.arrivals == "trace" and not config.trace:
        raise CisError("simulate: --arrivals trace needs a file; expected trace:FILE")
    if config.arrivals != "trace" and not any(n.arrival_rate > 0 for n in spec.nodes):
        raise CisError(f"spec {spec.name!r}: no node has an arrival_rate > 0; expected requests to arrive somewhere")
    check_positive(config.mmpp_ratio, "--mmpp-ratio")
    check_positive(config.mmpp_dwell, "--mmpp-dwell")
    for name, flag in (("mmpp_ratio", "--mmpp-ratio"), ("mmpp_dwell", "--mmpp-dwell")):
        if config.arrivals != "mmpp" and _given(config, name):
            raise CisError(f"simulate: {flag} shapes mmpp arrivals; expected --arrivals mmpp with it")


def _check_costs(config: SimConfig) -> None:
    """What a visit and a message cost, and how the machine slows."""
    check_positive(config.service_mean, "--service-mean")
    if config.payload_bytes < 0:
        raise CisError(f"simulate: --payload-bytes is {config.payload_bytes}; expected bytes >= 0")
    if config.burst is not None:
        check_positive(config.burst, "--burst")
    flags = {"hop_rtt": " (--visit-cost)", "entry_rtt": " (--entry-cost)", "visit_overhead": "",
             "message_work": " (message_work in --latency-profile)"}
    for value, name in [*((v, "hop_rtt") for v in config.hop_rtt), *((v, "entry_rtt") for v in config.entry_rtt),
                        (config.visit_overhead, "visit_overhead"), (config.message_work, "message_work")]:
        if not (math.isfinite(value) and value >= 0):
            raise CisError(f"simulate: {name} is {value}; expected seconds >= 0{flags[name]}")
    for point in config.idle_slowdown:
        if len(point) != 2 or not all(math.isfinite(v) and v >= 0 for v in point):
            raise CisError(
                f"simulate: idle slowdown point {point!r}; expected (idle seconds >= 0, extra seconds >= 0)"
            )
    if not (math.isfinite(config.interference) and config.interference >= 0):
        raise CisError(f"simulate: interference is {config.interference!r}; expected a number >= 0 (slowdown per "
                       "other busy core)")
    if not all(math.isfinite(v) and v > 0 for v in config.service_spread):
        raise CisError("simulate: service spread: expected multipliers > 0 (each call's time over the mean)")


def _is_seconds(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def check_batch_overhead(overhead: dict, spec: CisSpec, where: str = "--batch-overhead") -> None:
    """A one-line :class:`CisError` for a batch overhead of no node of ``spec`` or not seconds; ``where`` names
    the flag or file it came from."""
    for node_id, work in overhead.items():
        if node_id != "*" and node_id not in spec.ids:
            raise CisError(
                f"simulate: {where} {node_id}={work}: no node {node_id!r} in spec {spec.name!r}; expected "
                f"one of {', '.join(spec.ids)}"
            )
        points = [(0.0, work)] if isinstance(work, (int, float)) else work
        if not points or not all(isinstance(p, (tuple, list)) and len(p) == 2 and all(map(_is_seconds, p))
                                 for p in points):  # fmt: skip
            raise CisError(
                f"simulate: {where} {node_id}={work!r}; expected seconds >= 0, or [[idle seconds, "
                "seconds], ...] (both >= 0)"
            )


def _check_batches(config: SimConfig, spec: CisSpec) -> None:
    """What a batch costs per node, and how large a batch may be."""
    check_batch_overhead(config.batch_overhead, spec)
    if config.max_batch is not None and (isinstance(config.max_batch, bool) or config.max_batch < 1):
        raise CisError(f"simulate: --max-batch is {config.max_batch}; expected an integer >= 1")


def _check_links(config: SimConfig, spec: CisSpec) -> None:
    """The wires, the timeouts and the faults."""
    if config.wire not in WIRES:
        raise CisError(f"simulate: --wire is {config.wire!r}; expected one of {', '.join(WIRES)}")
    if not (math.isfinite(config.link_burst) and config.link_burst >= 0):
        raise CisError(f"simulate: --link-burst is {config.link_burst}; expected bytes >= 0")
    for value, flag in (
        (config.forward_timeout, "--forward-timeout"),
        (config.heartbeat, "--heartbeat"),
        (run_heartbeat_timeout(config), "--heartbeat-timeout"),
        (config.rto, "rto"),
    ):
        check_positive(value, flag)
    check_faults(config.faults, spec, "simulate: --faults")


def run_heartbeat_timeout(config: SimConfig) -> float:
    """The run's heartbeat timeout: the one given, else cis serve's rule for the run's heartbeat."""
    return heartbeat_timeout(config.heartbeat) if config.heartbeat_timeout is None else config.heartbeat_timeout


def _check_decision(config: SimConfig, spec: CisSpec, with_bundle: bool) -> None:
    """Without a bundle, shares decide; with one, thresholds."""
    for node_id, share in config.shares.items():
        if node_id not in spec.ids:
            raise CisError(
                f"simulate: --share {node_id}={share}: no node {node_id!r} in spec {spec.name!r}; expected one "
                f"of {', '.join(spec.ids)}"
            )
        if not 0.0 <= share <= 1.0:
            raise CisError(f"simulate: --share {node_id}={share}; expected a fraction in [0, 1]")
    if config.threshold is not None and not with_bundle:
        raise CisError(f"simulate: --threshold {config.threshold}: expected --bundle with it (its nodes' threshold)")
    if config.threshold is not None and not is_threshold(config.threshold):
        raise CisError(f"simulate: --threshold {config.threshold}; expected {THRESHOLD_EXPECTED}")
    if config.calibrate and not with_bundle:
        raise CisError("simulate: --calibrate calibrates a bundle's thresholds on its profile; expected --bundle "
                       "with it")
    if config.shares and with_bundle:
        raise CisError("simulate: --share applies without a bundle; with --bundle the thresholds decide")
    for name, flag in (("service_mean", "--service-mean"), ("payload_bytes", "--payload-bytes")):
        if with_bundle and _given(config, name):
            raise CisError(f"simulate: {flag} applies without a bundle; with --bundle its profiles give the "
                           "stage times and payloads")
    if config.calibrate and config.threshold is not None:
        raise CisError("simulate: --calibrate and --threshold both set the thresholds; expected one of them")


def _given(config: SimConfig, name: str) -> bool:
    """Whether the config's field differs from its default (a flag given with a value of its own)."""
    return getattr(config, name) != SimConfig.__dataclass_fields__[name].default


def check_positive(value: float, flag: str) -> None:
    """A one-line :class:`CisError` unless ``value`` is a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise CisError(f"simulate: {flag} is {value}; expected a number > 0")


def override_nodes(
    spec: CisSpec,
    workers: int | None = None,
    queue_limit: int | None = None,
    scale: float = 1.0,
    provider: str | None = None,
) -> CisSpec:
    """The spec with every node's workers / queue limit / provider replaced and arrival rates scaled."""
    if workers is not None and workers < 1:
        raise CisError(f"simulate: --workers is {workers}; expected an integer >= 1")
    if queue_limit is not None and queue_limit < 1:
        raise CisError(f"simulate: --queue-limit is {queue_limit}; expected an integer >= 1")
    nodes = [
        Node(
            **{
                **n.__dict__,
                "workers": n.workers if workers is None else workers,
                "queue_limit": n.queue_limit if queue_limit is None else queue_limit,
                "arrival_rate": n.arrival_rate * scale,
                "provider": n.provider if provider is None else provider,
            }
        )
        for n in spec.nodes
    ]
    return spec.replace_nodes(nodes)
