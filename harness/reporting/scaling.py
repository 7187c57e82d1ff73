"""Scaling on paper: the step time of N devices projected from measured pieces with a stated model.

The pieces, measured by one backend and strategy at one per-device batch (weak scaling):
  compute    one device's step time without communication: the 1-device step
  bytes      the gradients every step reduces (float32, as the allreduce figure times them)
  overlap    the share of the allreduce hidden behind the backward pass, measured on real devices at the
             largest count k: 1 - (step_k - compute) / allreduce_k, clipped to [0, 1]

The model:
  step(N)        = compute(N) + (1 - overlap) * volume * allreduce(N), volume the step's communication in
                 allreduces of the gradients: 1 (and ZeRO-2's all-gather and reduce-scatter), ZeRO-3's 1.5
  ring           each of the N devices on its own link (bandwidth bw one way, latency lat per ring step):
                 2 (N-1)/N * B / bw + 2 (N-1) * lat
  hierarchical   N = M hosts x g devices: a reduce-scatter and an all-gather inside each host, and between
                 them a ring across the M hosts of each device's B/g bytes over its share of the host's NICs:
                 2 (g-1)/g * B / bw_in + 2 (g-1) lat_in + 2 (M-1)/M * (B/g) / (nics * bw_nic / g) + 2 (M-1) lat_nic
  shared host    simulated devices (and nodes on loopback) are one host's cores and memory: N devices compute
                 one after another, compute(N) = N * c, and the ring's N links are one memory bus,
                 2 (N-1) * B / bw + 2 (N-1) lat; nothing overlaps (the cores that would overlap are the ones
                 computing), so overlap = 0 there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GB = 1e9


@dataclass(frozen=True)
class Link:
    gb_per_s: float  # one direction, per device (or per NIC), in 1e9 bytes/s
    latency_s: float  # per ring step


@dataclass(frozen=True)
class Profile:
    """An interconnect: devices per host, the link between them, and the NICs between hosts."""

    name: str
    summary: str
    devices_per_host: int
    inside: Link
    between: Link | None = None  # one NIC; None: a single host
    nics_per_host: int = 1
    shared: bool = False  # the devices share the host's cores and memory bus (simulated devices)
    source: str = ""


NCCL_LATENCY = (
    "per-step latencies: NCCL's tuning model (src/graph/tuning.cc: ring, Simple protocol, "
    "NVLink and PCIe 5.7 us, network 6.6 us)"
)
NVLINK_US, PCIE_US, NET_US = 5.7e-6, 5.7e-6, 6.6e-6

# Declared interconnects. NVLink bandwidth: the datasheet's total per GPU, halved for one direction.
PROFILES = {
    p.name: p
    for p in [
        Profile(
            "nvlink8-100g",
            "8 H100 per host on NVLink 4, one 100 Gbit/s NIC per host",
            8,
            Link(450, NVLINK_US),
            Link(12.5, NET_US),
            1,
            source="NVIDIA H100 SXM datasheet (NVLink 900 GB/s); a 100 Gbit/s Ethernet NIC; "
            + NCCL_LATENCY,
        ),
        Profile(
            "nvlink8-400g",
            "8 H100 per host on NVLink 4, eight 400 Gbit/s NICs per host (one per GPU)",
            8,
            Link(450, NVLINK_US),
            Link(50, NET_US),
            8,
            source="NVIDIA H100 SXM datasheet (NVLink 900 GB/s); DGX H100 (8x ConnectX-7 400 Gbit/s); "
            + NCCL_LATENCY,
        ),
        Profile(
            "dgx-a100",
            "DGX A100: 8 A100 on NVLink 3, eight 200 Gbit/s HDR InfiniBand NICs",
            8,
            Link(300, NVLINK_US),
            Link(25, NET_US),
            8,
            source="NVIDIA A100 datasheet (NVLink 600 GB/s); DGX A100 (8x ConnectX-6 HDR 200 Gbit/s); "
            + NCCL_LATENCY,
        ),
        Profile(
            "dgx1-v100",
            "DGX-1: 8 V100 on NVLink 2, four 100 Gbit/s EDR InfiniBand NICs",
            8,
            Link(150, NVLINK_US),
            Link(12.5, NET_US),
            4,
            source="NVIDIA V100 SXM2 datasheet (NVLink 300 GB/s); DGX-1 (4x EDR 100 Gbit/s); "
            + NCCL_LATENCY,
        ),
        Profile(
            "pcie4-25g",
            "4 GPUs per host on PCIe 3.0 x16, one 25 Gbit/s RoCE NIC per host",
            4,
            Link(15.75, PCIE_US),
            Link(3.125, NET_US),
            1,
            source="PCIe 3.0 x16 (15.75 GB/s one way); the 25 Gbit/s network of Horovod's 512-GPU benchmark; "
            + NCCL_LATENCY,
        ),
    ]
}
DEFAULT_PROFILES = ("nvlink8-100g", "nvlink8-400g")


# ------------------------------------------------------------------------------ allreduce time


def ring_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring allreduce of `nbytes` over n devices, each on its own link."""
    return 2 * (n - 1) / n * nbytes / (link.gb_per_s * GB) + 2 * (n - 1) * link.latency_s


def shared_ring_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring allreduce over n devices whose links are one bus: the n links' traffic, one after another."""
    return n * ring_seconds(nbytes, n, link)


def hierarchical_seconds(
    nbytes: float, hosts: int, per_host: int, inside: Link, nic: Link, nics: int
) -> float:
    """Reduce-scatter and all-gather inside each host, a ring of each device's shard across the hosts."""
    shard = nbytes / per_host
    # one device's share of the host's NICs
    nic_share = Link(nic.gb_per_s * nics / per_host, nic.latency_s)
    return ring_seconds(nbytes, per_host, inside) + ring_seconds(shard, hosts, nic_share)


def allreduce_seconds(nbytes: float, n: int, profile: Profile) -> float:
    if n == 1:
        return 0.0
    if profile.shared:
        return shared_ring_seconds(nbytes, n, profile.inside)
    g = profile.devices_per_host
    if n <= g:
        return ring_seconds(nbytes, n, profile.inside)
    if profile.between is None or n % g:
        raise ValueError(f"{profile.name}: {n} devices are not whole hosts of {g}")
    return hierarchical_seconds(
        nbytes, n // g, g, profile.inside, profile.between, profile.nics_per_host
    )


# ------------------------------------------------------------------------------ the pieces and the projection


@dataclass(frozen=True)
class Measured:
    """One run's figures: its devices (nodes among them), median step and allreduce seconds."""

    devices: int
    nodes: int
    step_s: float
    allreduce_s: float | None


@dataclass(frozen=True)
class Pieces:
    """What the projection needs of one backend and strategy, and where each piece came from."""

    name: str  # "torch ddp", "torch ddp on nodes", ...
    per_device_batch: int
    nbytes: int
    compute_s: float  # one device's step without communication (each device its own compute)
    overlap: float
    overlap_note: str
    measured: tuple[Measured, ...]
    # on a shared host: one replica's share of the host's step
    shared_compute_s: float | None = None
    host_link: Link | None = None  # the link measured on this host (latency folded into bandwidth)
    fitted_at: int | None = None  # the device count the host figures were fitted at
    # the step's communication in allreduces of the gradient bytes: 1 for an allreduce, and for ZeRO-2's one
    # all-gather and one reduce-scatter; 1.5 for ZeRO-3's two all-gathers (forward, backward) and a reduce-scatter
    volume: float = 1.0


def fit_shared_host(run: Measured, nbytes: int, volume: float = 1.0) -> tuple[float, Link]:
    """One replica's compute and the bus bandwidth of a shared host, from one run of k > 1 devices:
    step_k = k c + volume x allreduce_k, allreduce_k = 2 (k-1) B / bw (one message size cannot tell latency from
    bandwidth, so the fit puts it all in bandwidth: exact at this size)."""
    k, a = run.devices, run.allreduce_s
    return (run.step_s - volume * a) / k, Link(2 * (k - 1) * nbytes / a / GB, 0.0)


def measured_overlap(one: Measured, run: Measured, volume: float = 1.0) -> float:
    """The share of run's communication hidden behind compute, against the 1-device step (real devices)."""
    exposed = run.step_s - one.step_s
    return min(1.0, max(0.0, 1 - exposed / (volume * run.allreduce_s)))


def pieces(
    name: str,
    per_device_batch: int,
    nbytes: int,
    runs: list[Measured],
    shared: bool,
    volume: float = 1.0,
) -> Pieces:
    """The pieces of one backend and strategy from its runs (at least one), its step's communication `volume`
    allreduces. On a shared host the host's figures are fitted at the smallest count above 1 and the rest of the
    runs are left to check the model."""
    runs = sorted(runs, key=lambda r: r.devices)
    one = next((r for r in runs if r.devices == 1), None)
    several = [r for r in runs if r.devices > 1 and r.allreduce_s]
    # one device's compute without a 1-device run: a replica's share of a shared host's step, or a real
    # device's whole step (an upper bound: its communication included)
    first = runs[0]
    compute = one.step_s if one else first.step_s / first.devices if shared else first.step_s
    base = Pieces(name, per_device_batch, nbytes, compute, 0.0, "", tuple(runs), volume=volume)
    if shared:
        note = "not measurable: simulated devices share the cores that would overlap, so none is counted"
        if not several:
            return replace(base, overlap_note=note)
        c, link = fit_shared_host(several[0], nbytes, volume)
        if c <= 0:  # an allreduce figure longer than the step: nothing to fit
            return replace(base, overlap_note=note)
        return replace(
            base,
            compute_s=one.step_s if one else c,
            overlap_note=note,
            shared_compute_s=c,
            host_link=link,
            fitted_at=several[0].devices,
        )
    if one is None or not several:
        return replace(
            base,
            overlap_note="not measured (needs a 1-device run and a run on several); none counted",
        )
    last = several[-1]
    k = last.devices
    link = Link(2 * (k - 1) / k * nbytes / last.allreduce_s / GB, 0.0)
    return replace(
        base,
        overlap=measured_overlap(one, last, volume),
        host_link=link,
        fitted_at=k,
        overlap_note=f"measured at {k} devices",
    )


def host_profile(p: Pieces, shared: bool) -> Profile | None:
    """The interconnect measured by the run itself: its devices on the link its allreduce figure shows."""
    if p.host_link is None:
        return None
    devices = max(r.devices for r in p.measured)
    return Profile(
        "measured",
        f"this host, as measured ({p.host_link.gb_per_s:.3g} GB/s at {p.fitted_at} devices)",
        devices,
        p.host_link,
        shared=shared,
        source="the run's own allreduce figure",
    )


@dataclass(frozen=True)
class Point:
    devices: int
    compute_s: float
    allreduce_s: float
    step_s: float
    images_per_s: float
    efficiency: float


def project(p: Pieces, profile: Profile, counts: list[int]) -> list[Point]:
    """step(N) = compute(N) + (1 - overlap) * volume * allreduce(N) at each count; efficiency against 1 device."""
    points = []
    for n in counts:
        compute = n * p.shared_compute_s if profile.shared else p.compute_s
        reduce = p.volume * allreduce_seconds(p.nbytes, n, profile)
        step = compute + (1 - (0.0 if profile.shared else p.overlap)) * reduce
        points.append(Point(n, compute, reduce, step, n * p.per_device_batch / step, 0.0))
    single = (
        points[0].images_per_s
        if points and points[0].devices == 1
        else p.per_device_batch / p.compute_s
    )
    return [replace(q, efficiency=q.images_per_s / (q.devices * single)) for q in points]


def powers_of_two(most: int) -> list[int]:
    counts, n = [], 1
    while n <= most:
        counts.append(n)
        n *= 2
    return counts
