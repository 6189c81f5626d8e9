"""Parallelism of one job from its flows: which pairs carry pipeline (PP) or data-parallel (DP)
traffic, the pipeline stages, and the job's dp, pp and tp degrees.

Flows are grouped per (source host, destination host, size family); hosts rather than NICs because
with rail-aligned NICs (PXN) a send from GPU i to GPU j leaves through NIC j, so the two directions
of one GPU pair can use different NIC pairs. A size family is the byte counts within a relative
tolerance of their neighbours: exporters add header bytes per packet, so one transfer size is
never reported to the byte, and the two directions of a pair may be counted differently.
Records whose bytes are no transfer's size are judged otherwise: sFlow's sampled records (no
span, bytes from a few packets) form one group per direction, and a flow cache's records that
merge several transfers (a whole number of a PP group's activations) carry the pipeline of their
host pair. Where a cache merges a host pair's sends into records covering much of the job's time
(a pipeline sending through the step's compute, with quiet gaps shorter than the idle timeout),
those records are one group per direction too, and are told apart by their ends (see
`ParallelismParams.continuous_coverage`).

- A collective (ring or tree all-reduce, reduce-scatter + all-gather, all-to-all) is symmetric:
  in every round each participant sends while its peers send too, so the flows of both directions
  of a host pair overlap in time.
- A pipeline is not: each step opens with warm-up forward sends before any backward gradient has
  come back, and closes with cool-down backward sends after the last forward. So a PP host pair
  carries one activation size both ways in equal numbers, and a share of its flows has no flow of
  the other direction in flight.

The MoE all-to-all comes first: its volume per peer follows the router's load, so on a host pair
it comes as a family of neighbouring sizes with about as many flows each, where a pipeline repeats
one activation size per micro-batch and a DP sync has a bucket size and a tail. Such a family is
'other' whatever its timing: the all-to-all runs inside forward and backward, so when one rank
computes late (a straggler) its peers' sends go out before its own and look like warm-up forwards.
It often shares its host pairs with the DP sync (expert-parallel group = DP group), which keeps its
own sizes and label. Of the remaining groups, those balanced both ways and asymmetric in time are
PP; the rest of the traffic between members is collective: 'dp' within a pipeline stage, 'other'
between stages (tied embeddings). Flows to non-members (storage, other jobs) are 'other'.

Stages: a depth-first walk along each chain of PP host pairs, numbered from the end whose sends
open the steps (warm-up forwards). A stage smaller than a host shows in the rails: a forward send
reaches the next host's first GPUs only. Ranks follow Megatron (rank = tp_rank + tp * (dp_rank +
dp * pp_stage), consecutive ranks on a host); tp comes from the checkpoint writers (DP rank 0 of
every stage and TP rank), else from the rails a DP crossing between two hosts uses (one per TP
rank, PXN), else the stage's DP stays on NVLink and cannot be seen: TP is then given the stage.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import (
    combination_ids, combined_key, encoded, filter_rows, group_median, group_reduce, group_spans, lookup,
    stable_order, unique_counts, unique_inverse, unique_rows,
)
from prism_core.constants import CHECKPOINT_FLOW_BYTES, DP, FLOW_FAMILY_BYTES, FLOW_KIND, NS_PER_S, OTHER, PP
from prism_core.recognition.merge import connected
from prism_core.schema import COMM_KINDS, COMM_PAIRS, JOB_GPUS, TS, conform


@dataclass(frozen=True)
class ParallelismParams:
    """Every number parallelism is inferred with. A *threshold* is policy: a line Prism has to
    draw somewhere. A *prior* is a property of a job, assumed for every job until it can be
    learned from the job's own traffic. The GPUs a job holds on each host are its members' (the
    GPUs its NICs serve), not a fleet-wide count: platforms allocate GPUs, and jobs share hosts."""

    # threshold, ns: flows of the two directions of a host pair this close count as in flight
    # together (exporter clocks disagree by a few milliseconds)
    in_flight_slack_ns: int = 15_000_000
    # prior, share of flows: a pipeline's group has at least this share without reverse traffic in
    # flight, the first warm-up forward of every step, 1 / micro-batches (up to 128 micro-batches:
    # real jobs run 32 and more; a collective's groups have next to none, as every round of it
    # overlaps the reverse direction on some rail of the host pair)
    pipeline_asymmetry: float = 1 / 128
    # threshold, share: a pipeline's unanswered sends (each step's warm-up and cool-down) recur
    # over all of its traffic, so the middle 80% of them span at least this share of the time the
    # middle 80% of its sends span; sends left unanswered in one stretch of the hour were delayed
    # by a fault there (a slow NIC holding back one direction of a tree's reduce). Asked of the groups
    # with `recurrence_min_flows` unanswered sends or more that send for `recurrence_min_span_ns`
    # or longer (a job's last seconds in an hour leave its last step's sends unanswered)
    pipeline_recurrence: float = 0.4
    recurrence_min_flows: int = 8
    recurrence_min_span_ns: int = 120 * NS_PER_S
    # threshold, flows: a PP group repeats its activation size on every micro-batch of every step;
    # a few records whose garbled sizes happen to fall together are not one, and a size family
    # (size_tolerance) recurs at least this often
    pipeline_min_flows: int = 8
    # threshold, ratio of flow counts: a PP group's reverse group (same size family, other
    # direction) has about as many flows, within this factor
    balance: float = 2.0
    # threshold, relative gap: neighbouring distinct flow sizes closer than this are one transfer
    # size as exporters count it (per-packet headers are 1-2% of a packet and differ between
    # exporters by under half a percent, extension headers add a share of packets); transfer
    # sizes a job really tells apart (bucket and tail, activation and gradient) differ by more
    size_tolerance: float = 0.01
    # prior, ratio of sizes: an all-to-all's sizes on one directed host pair (the router's load per
    # peer) are, sorted, each within this factor of the next
    size_step: float = 2.0
    # prior, ratio of flow counts: an all-to-all's sizes come up about as often, within this factor
    family_spread: float = 1.5
    # threshold, sizes: a family of this many sizes or more on one directed host pair is an all-to-all
    moe_family: int = 4
    # prior, share of bytes: a collective moves about as many bytes over each link it crosses (a
    # ring's hops each carry the buffer's share, a tree's levels within 2x of each other); behind a
    # flow cache, a NIC pair of a DP host pair that carried under this share of the bytes of the
    # pair's busiest NIC pair carried another collective (`_beside_the_sync`)
    sync_link_share: float = 0.125
    # threshold, share of the job's span in the hour: a flow cache's records of a directed host
    # pair that cover this much of it (their union) are continuous sends. A cache merges a queue
    # pair's transfers until it idles for its idle timeout: a pipeline sends through the step's
    # compute (its records span forward and backward, or run to the active timeout where the
    # optimizer's gap is shorter than the idle timeout), a DP sync sits at the step's end (its
    # records cover the sync's share of the step: 2-20% on small). A continuous record overlaps
    # any reverse traffic, so it is answered only by reverse traffic in flight at its first and
    # at its last packet: a pipeline opens the forward direction's records first (warm-up) and
    # closes the backward direction's last (cool-down), a collective (ZeRO's gathers, an
    # all-to-all) sends both ways at once.
    continuous_coverage: float = 0.3
    # threshold, ns: a continuous record is answered when reverse traffic is in flight this close
    # to its first and to its last packet. A collective's two directions open and close within
    # its own latency (a tree's reduce opens before its broadcast and closes before it: 15-50 ms
    # on small, where a cache merged a DP tree from step to step); a pipeline's backward
    # direction opens a micro-batch's forward pass through the later stages after the forward
    # one (0.1-0.5 s on small), and closes as long after it
    continuous_slack_ns: int = 50_000_000


DEFAULT_PARAMS = ParallelismParams()
# bins of a group's span in which its sends' and its unanswered sends' spreads are read
SPREAD_BINS = 256


@dataclass
class Parallelism:
    job_gpus: pa.Table  # JOB_GPUS schema
    comm_pairs: pa.Table  # COMM_PAIRS schema
    dp: int | None  # None: no traffic between members this hour to tell
    pp: int | None
    tp: int | None
    # per flow handed in: its kind code (DP | PP | OTHER; OTHER for flows sent outside a
    # membership) and the smallest size of its size family (its own bytes where it has none)
    flow_kind: np.ndarray | None = None
    flow_family_bytes: np.ndarray | None = None
    # what the next hour starts from (`_remembered_layout`): the checkpoint writers and the degrees
    # read from the most flows between members, this hour or an earlier one
    state: dict | None = None

    def labelled(self, job_flows: pa.Table) -> pa.Table:
        """The flows `identify_parallelism` was given, with each one's kind (FLOW_KIND) and size
        family (FLOW_FAMILY_BYTES): the labels the timeline splits steps by, so that it reads each
        flow as the group that made its pair DP or PP did (a MoE all-to-all or a tied embedding
        on a DP or PP pair keeps its own kind). Unchanged when there were no members to label by."""
        if self.flow_kind is None:
            return job_flows
        return job_flows.append_column(FLOW_KIND, pa.array(self.flow_kind, pa.int8())).append_column(
            FLOW_FAMILY_BYTES, pa.array(self.flow_family_bytes, pa.int64()))


def identify_parallelism(
    job_id: str, job_flows: pa.Table, members: pa.Table, *, params: ParallelismParams = DEFAULT_PARAMS,
    cached_exporters: Collection[str] = (), samplers: Collection[str] | None = None, previous: dict | None = None,
) -> Parallelism:
    """Pairs, stages and degrees of one job from the flows its members sent (an hour of them), and
    its GPUs with the span of their traffic for the job this hour (the membership's).
    Flows a member sent outside its membership interval belong to another job and are ignored.
    `cached_exporters`: the `sampler_address` of the exporters that keep a flow cache (their
    resolution profile's kind is `flow_cache`): their records may merge several transfers.
    `samplers`: those that sample packets (profile kind `sampled`): their records are instants;
    None without profiles: a record is then an instant when it is sampled and has no span.
    `previous`: the state the job's previous hour left (`Parallelism.state`, `_remembered_layout`)."""
    handed_bytes = job_flows["bytes"].to_numpy().astype(np.int64, copy=False)
    gpus = _member_gpus(members)
    # each flow's source among the member GPUs, its text looked up once for both uses
    src = lookup(job_flows, "src_addr", gpus["addr"])
    sent = _sent_while_member(job_flows, members, gpus, src)
    job_flows = filter_rows(job_flows, sent)
    src = src[sent]
    dst = lookup(job_flows, "dst_addr", gpus["addr"])
    inside = dst >= 0
    kind = np.full(job_flows.num_rows, OTHER, np.int8)
    family_bytes = handed_bytes[sent]
    job_gpus = conform(
        pa.table({"job_id": pa.array([job_id] * gpus.num_rows, pa.string()),
                  **{c: gpus[c] for c in ("addr", "host", "gpu", "first_seen", "last_seen")}}),
        JOB_GPUS,
    )
    if not inside.any():  # nothing between members this hour: stages and degrees unknown
        pairs = _comm_pairs(job_id, job_flows, src, gpus["addr"], kind)
        return Parallelism(job_gpus, pairs, None, None, None, *_per_flow_handed(handed_bytes, sent, kind, family_bytes),
                           state=previous)
    sampled = _sampled_records(job_flows, samplers)
    flows = _InternalFlows.of(job_flows, inside, src[inside], dst[inside], gpus, sampled[inside], cached_exporters)
    groups = _group_flows(flows, params)
    all_to_all = _is_all_to_all(groups, params)
    pipeline = _is_pipeline(groups, params, all_to_all)
    pipeline_sends = pipeline[groups.of_flow] | _merged_pipeline_sends(flows, groups, pipeline, params)
    # the sends to non-members that may be a checkpoint's shards (checkpoint-sized: a monitoring
    # reply or a log write may repeat a small size by chance), a copy of these few rows alone;
    # `family_bytes` is still every flow's bytes here
    saves = ~inside & (family_bytes >= CHECKPOINT_FLOW_BYTES)
    external = job_flows.select(["bytes", "src_addr"]).filter(pa.array(saves)).append_column(
        "sampled", pa.array(sampled[saves]))
    remembered = tuple((previous or {}).get("checkpoint_writers", (0, 0)))
    layout = _Layout.infer(gpus, flows, external, groups, pipeline, pipeline_sends, all_to_all, remembered)
    between_stages = layout.host_stage[groups.src_host] != layout.host_stage[groups.dst_host]
    group_kind = np.where(pipeline, PP, np.where(all_to_all | between_stages, OTHER, DP)).astype(np.int8)
    kind[inside] = np.where(pipeline_sends, PP, group_kind[groups.of_flow])
    kind[inside] = np.where(_beside_the_sync(flows, groups, kind[inside], params), OTHER, kind[inside])
    # a sampled record's bytes are no transfer's size, nor a continuous record's (a sum of many):
    # each is a family of its own
    family_bytes[inside] = np.where(flows.sampled | groups.continuous, flows.size, groups.size[groups.of_flow])
    job_gpus = job_gpus.set_column(4, "pp_stage", pa.array(layout.pp_stage, pa.int32()))
    job_gpus = job_gpus.set_column(5, "dp_rank", pa.array(layout.dp_rank, pa.int32()))
    pairs = _comm_pairs(job_id, job_flows, src, gpus["addr"], kind)
    (dp, pp, tp), state = _remembered_layout((layout.dp, layout.pp, layout.tp), layout.n_gpus, len(flows.start),
                                            layout.writers, previous)
    return Parallelism(job_gpus, pairs, dp, pp, tp, *_per_flow_handed(handed_bytes, sent, kind, family_bytes),
                       state=state)


def _beside_the_sync(flows: _InternalFlows, groups: _Groups, kind: np.ndarray, params: ParallelismParams
                     ) -> np.ndarray:
    """Per flow between members: a flow cache's continuous record read as the DP sync on a NIC
    pair that carried under `sync_link_share` of the bytes of the busiest NIC pair of its group.
    Behind a cache a host pair's collectives merge into sums of one family: an MoE all-to-all over
    every rail joins the DP sync of the rails its ring crosses, and only their bytes tell them
    apart (on `small`, 41 GB an hour on each all-to-all rail beside 1.1 TB on the sync's)."""
    merged = groups.continuous & (kind == DP)
    if not merged.any():
        return merged
    group = groups.of_flow[merged]
    link = combination_ids(group, flows.src[merged], flows.dst[merged])
    carried = np.bincount(link, weights=flows.size[merged])
    group_of_link = np.zeros(len(carried), np.int64)
    group_of_link[link] = group
    light = carried < params.sync_link_share * group_reduce(group_of_link, carried, np.maximum)
    beside = np.zeros(len(merged), bool)
    beside[merged] = light[link]
    return beside


def _remembered_layout(degrees: tuple[int, int, int], n_gpus: int, flows: int, writers: tuple[int, int],
                      previous: dict | None) -> tuple[tuple[int, int, int], dict]:
    """The degrees to report and the state for the next hour. A job's layout does not change while
    it runs, but an hour shows it only as well as its traffic does: a job that starts or ends
    minutes into the hour may show too little of its pipeline to find it. So the degrees read from
    the most flows between members (this hour's `flows`, or an earlier hour's) stand while they
    multiply to the job's GPUs this hour (a relaunch on another share of GPUs is a new layout). The
    checkpoint writers tp was told by (`writers`; (0, 0): none this hour, or remembered) are
    kept for the hours without a save. The hour's pairs and stages stay what its own traffic shows."""
    previous = previous or {}
    state = {"degrees": list(degrees), "flows": flows}
    earlier = previous.get("degrees")
    if earlier and previous.get("flows", 0) > flows and int(np.prod(earlier)) == n_gpus:
        state = {"degrees": list(earlier), "flows": previous["flows"]}
    if any(writers):
        state["checkpoint_writers"] = list(writers)
    return tuple(state["degrees"]), state


def _per_flow_handed(handed_bytes: np.ndarray, sent: np.ndarray, kind: np.ndarray,
                     family_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kinds and families of the flows sent while a member, spread over all the flows handed in
    (bytes of each): a flow sent outside its sender's membership is another job's, OTHER and a
    family of its own."""
    all_kinds = np.full(len(handed_bytes), OTHER, np.int8)
    all_kinds[sent] = kind
    all_families = handed_bytes.copy()
    all_families[sent] = family_bytes
    return all_kinds, all_families


def _sent_while_member(job_flows: pa.Table, members: pa.Table, gpus: pa.Table, src: np.ndarray) -> np.ndarray:
    """Per flow: sent while its source (`src`: its row of `gpus`, -1 for none) was a member (its
    address's first row of `members`)."""
    row = pc.index_in(gpus["addr"], value_set=members["addr"]).to_numpy()
    # each member GPU's interval, and an empty one (from the latest instant to the earliest) last,
    # for no source (-1): two lookups per flow in tables the size of the job's GPUs
    first_ns = np.r_[members["first_ns"].to_numpy()[row], np.iinfo(np.int64).max]
    last_ns = np.r_[members["last_ns"].to_numpy()[row], np.iinfo(np.int64).min]
    start = job_flows["time_flow_start_ns"].to_numpy()
    within = start >= first_ns[src]
    within &= start <= last_ns[src]
    return within


def _sampled_records(job_flows: pa.Table, samplers: Collection[str] | None) -> np.ndarray:
    """Per record: a packet sampler's instant (sFlow: no flow start or end, bytes estimated). By
    the exporter's profile (`samplers`); without profiles, a record sampled and without a span.
    A sampled NetFlow exporter's records keep their spans, and their bytes scaled back are the
    transfer's; on a millisecond clock a short transfer's start and end are one tick too, which
    is why the profile decides where there is one."""
    if samplers is not None and "sampler_address" in job_flows.column_names:
        return lookup(job_flows, "sampler_address", pa.array(sorted(samplers), pa.string())) >= 0
    if "sampling_rate" not in job_flows.column_names:
        return np.zeros(job_flows.num_rows, bool)
    start, end = (job_flows[c].to_numpy() for c in ("time_flow_start_ns", "time_flow_end_ns"))
    return (pc.fill_null(job_flows["sampling_rate"], 1).to_numpy() > 1) & (end == start)


def _member_gpus(members: pa.Table) -> pa.Table:
    """One row per member address (addr, host, gpu, first_seen, last_seen, host_code, active,
    gpus, local), sorted by host then gpu. `active`: the host is still in the job at its last
    sighting (a host replaced in a restart is not, and must not count twice in the degrees).
    `gpus`: the GPUs the NIC serves (membership's `gpus`, 1 where it does not say); `local`: the
    job's index of the NIC's first GPU on its host (the job's GPUs there counted from 0)."""
    served = pc.fill_null(members["gpus"], 1) if "gpus" in members.column_names else pa.array(np.ones(members.num_rows, np.int32))
    members = members.select(["addr", "host", "gpu", "first_ns", "last_ns"]).append_column("gpus", served)
    spans = members.group_by(["addr", "host", "gpu"], use_threads=False).aggregate(
        [("first_ns", "min"), ("last_ns", "max"), ("gpus", "max")]
    )
    spans = spans.sort_by([("host", "ascending"), ("gpu", "ascending")])
    last_ns = spans["last_ns_max"].to_numpy()
    host_code = pc.index_in(spans["host"], value_set=pc.unique(spans["host"])).to_numpy()
    served = spans["gpus_max"].to_numpy().astype(np.int64)
    before = np.cumsum(served) - served  # GPUs of earlier rows, on any host
    host_start = np.r_[True, host_code[1:] != host_code[:-1]] if len(host_code) else np.zeros(0, bool)
    local = before - before[np.flatnonzero(host_start)][np.cumsum(host_start) - 1]
    return pa.table(
        {
            "addr": spans["addr"],
            "host": spans["host"],
            "gpu": spans["gpu"].cast(pa.int32()),
            "first_seen": spans["first_ns_min"].cast(TS),
            "last_seen": spans["last_ns_max"].cast(TS),
            "host_code": host_code.astype(np.int64),
            "active": last_ns == last_ns.max(),
            "gpus": served,
            "local": local,
        }
    )


@dataclass
class _InternalFlows:
    """Flows between members, as arrays: host codes, the source and destination NICs (whose rail,
    their place among the job's GPUs on their host, and the GPUs they serve are looked up per
    member), size, times, and whether the record was sampled (sFlow: bytes estimated from a few
    packets, start = end)."""

    src_host: np.ndarray
    dst_host: np.ndarray
    src: np.ndarray  # the source and destination NICs' rows of the member GPUs (int32: a job's
    dst: np.ndarray  # flows are millions, its NICs thousands)
    rail_of_member: np.ndarray  # per member GPU row: its NIC's rail, and the GPUs that NIC serves
    gpus_of_member: np.ndarray
    size: np.ndarray
    start: np.ndarray
    end: np.ndarray
    sampled: np.ndarray
    cached: np.ndarray  # from an exporter with a flow cache: may merge several transfers
    exporter: np.ndarray  # code of the record's exporter (sampler_address), 0 without
    n_hosts: int

    @classmethod
    def of(cls, job_flows: pa.Table, inside: np.ndarray, src: np.ndarray, dst: np.ndarray,
           gpus: pa.Table, sampled: np.ndarray, cached_exporters: Collection[str] = ()) -> _InternalFlows:
        """The flows of `job_flows` where `inside` (`src`, `dst`: their sources' and destinations'
        rows of `gpus`; `sampled`: theirs that are a sampler's instants); read as arrays, the
        table is not copied."""
        host_code = gpus["host_code"].to_numpy()
        start, end = (job_flows[c].to_numpy()[inside] for c in ("time_flow_start_ns", "time_flow_end_ns"))
        cached = np.zeros(len(start), bool)
        exporter = np.zeros(len(start), np.int64)
        if len(cached_exporters) and "sampler_address" in job_flows.column_names:
            exporters = pa.array(sorted(cached_exporters), pa.string())
            # the cached exporters numbered from 1, any other 0
            exporter = lookup(job_flows, "sampler_address", exporters)[inside].astype(np.int64) + 1
            cached = (exporter > 0) & ~sampled
        return cls(
            src_host=host_code[src],
            dst_host=host_code[dst],
            src=src.astype(np.int32, copy=False),
            dst=dst.astype(np.int32, copy=False),
            rail_of_member=gpus["local"].to_numpy(),
            gpus_of_member=gpus["gpus"].to_numpy(),
            size=job_flows["bytes"].to_numpy()[inside],
            start=start,
            end=end,
            sampled=sampled,
            cached=cached,
            exporter=exporter,
            n_hosts=int(host_code.max()) + 1,
        )


@dataclass
class _Groups:
    """Flows of the job between members, grouped by (src host, dst host, size family)."""

    src_host: np.ndarray  # per group, host code
    dst_host: np.ndarray
    size: np.ndarray  # bytes of the smallest of its flows
    flows: np.ndarray  # flows in the group
    unmatched: np.ndarray  # flows with no flow of the reverse group in flight
    reverse: np.ndarray  # index of the (dst host, src host, size family) group, -1 when absent
    of_flow: np.ndarray  # group of every internal flow
    answered: np.ndarray  # per internal flow: a flow of the reverse group in flight with it
    continuous: np.ndarray  # per internal flow: a flow cache's record of continuous sends (`_continuous`)
    lumped: np.ndarray  # per group: continuous records, whose size is none of a transfer
    sampled: np.ndarray  # per group: sampled records (one packet's instant each, no transfer's size)
    sampled_bytes: np.ndarray  # per group: the bytes its direction's sampled records estimate
    reverse_sampled_bytes: np.ndarray  # per group: those of the reverse direction
    # per group: the time the middle 80% of its unmatched flows' starts span, over the time the
    # middle 80% of all its flows' starts span (`_unanswered_spread`); its first to last start
    unanswered_spread: np.ndarray
    span_ns: np.ndarray


def _group_flows(flows: _InternalFlows, params: ParallelismParams) -> _Groups:
    n_hosts = flows.n_hosts
    # a sampled record's bytes say how many of its packets were sampled, not the transfer's size
    # (nor do they bridge two sizes into one family): the sampled records of a pair are one group
    any_sampled = bool(flows.sampled.any())
    direction = flows.src_host * n_hosts + flows.dst_host
    # so are a flow cache's continuous records (sums of however many transfers the cache held)
    continuous = _continuous(flows, direction, params)
    any_continuous = bool(continuous.any())
    sized = ~flows.sampled & ~continuous
    size_code = np.full(len(flows.size), -1)
    sizes, size_code[sized] = size_families(flows.size[sized], params.size_tolerance, params.pipeline_min_flows)
    size_code[flows.sampled] = len(sizes)
    size_code[continuous] = len(sizes) + 1
    sizes = np.r_[sizes, np.median(flows.size[flows.sampled]) if any_sampled else 0,
                  np.median(flows.size[continuous]) if any_continuous else 0]
    n_sizes = len(sizes)
    group_key = direction * n_sizes
    group_key += size_code
    del size_code
    group_keys, of_flow = unique_inverse(group_key)
    del group_key
    pair, size_of_group = np.divmod(group_keys, n_sizes)
    src_of_group, dst_of_group = np.divmod(pair, n_hosts)
    reverse_keys = (dst_of_group * n_hosts + src_of_group) * n_sizes + size_of_group
    position = np.minimum(np.searchsorted(group_keys, reverse_keys), len(group_keys) - 1)
    reverse = np.where(group_keys[position] == reverse_keys, position, -1)
    # only the reverse flows of the same size answer: a collective sends the same chunks both ways
    # and a pipeline returns each activation's gradient, while a flow cache's records that merge
    # many transfers last long enough to overlap anything else on the pair. A sampled record is
    # one packet's time in a transfer of unknown size: any reverse traffic answers it.
    answered = reverse_in_flight(of_flow, reverse[of_flow], flows.start, flows.end, params.in_flight_slack_ns)
    if any_continuous or any_sampled:
        reverse_direction = flows.dst_host * n_hosts + flows.src_host
    if any_continuous:
        answered[continuous] = _reverse_open_at_both_ends(direction, reverse_direction, flows, continuous, params)
    if any_sampled:
        slack = np.maximum(params.in_flight_slack_ns, _sampling_interval(direction, flows)[reverse_direction])
        on_pair = reverse_in_flight(direction, reverse_direction, flows.start, flows.end, slack.astype(np.int64))
        answered = np.where(flows.sampled, on_pair, answered)
    sampled_bytes = np.zeros(n_hosts * n_hosts)
    if any_sampled:
        sampled_bytes = np.bincount(direction[flows.sampled], weights=flows.size[flows.sampled],
                                    minlength=len(sampled_bytes))
    return _Groups(
        src_host=src_of_group,
        dst_host=dst_of_group,
        size=sizes[size_of_group],
        flows=np.bincount(of_flow, minlength=len(group_keys)),
        unmatched=np.bincount(of_flow, weights=~answered, minlength=len(group_keys)),
        reverse=reverse,
        of_flow=of_flow,
        answered=answered,
        continuous=continuous,
        lumped=(size_of_group == n_sizes - 1),
        sampled=(size_of_group == n_sizes - 2) & any_sampled,
        sampled_bytes=sampled_bytes[pair],
        reverse_sampled_bytes=sampled_bytes[dst_of_group * n_hosts + src_of_group],
        **_unanswered_spread(of_flow, len(group_keys), flows.start, answered, params.recurrence_min_flows),
    )


def _unanswered_spread(of_flow: np.ndarray, n_groups: int, start: np.ndarray, answered: np.ndarray,
                       min_flows: int) -> dict[str, np.ndarray]:
    """Per group: `span_ns`, from its first start to its last, and `unanswered_spread`, how much
    of the time the middle 80% of its flows' starts cover the middle 80% of its unanswered ones'
    cover (0 for a group with fewer than `min_flows` unanswered). Both from a histogram of the
    starts over the group's span (`SPREAD_BINS`): a group's traffic may stop for a while (a hang,
    a restart), so its span alone is no measure of how its sends spread."""
    first, last = group_spans(of_flow, n_groups, start, start)
    span, spread = last - first, np.zeros(n_groups)
    judged = np.flatnonzero(np.bincount(of_flow[~answered], minlength=n_groups) >= min_flows)
    if not len(judged):
        return {"unanswered_spread": spread, "span_ns": span}
    slot = np.full(n_groups, -1)
    slot[judged] = np.arange(len(judged))
    flow_slot = slot[of_flow]
    # usually every group is judged: then every flow, without selecting them
    rows = slice(None) if len(judged) == n_groups else np.flatnonzero(flow_slot >= 0)
    group = flow_slot[rows]
    position = start[rows] - first[judged][group]
    position *= SPREAD_BINS
    position //= span[judged][group] + 1
    idle = ~answered[rows]
    spread[judged] = (_middle_bins(group[idle], len(judged), position[idle])
                      / _middle_bins(group, len(judged), position))
    return {"unanswered_spread": spread, "span_ns": span}


def _middle_bins(group: np.ndarray, n_groups: int, position: np.ndarray) -> np.ndarray:
    """Per group: how many of the `SPREAD_BINS` bins the middle 80% of its rows' `position`s
    (bin indices) span, at least one."""
    counts = np.bincount(group * SPREAD_BINS + position, minlength=n_groups * SPREAD_BINS)
    cumulative = np.cumsum(counts.reshape(n_groups, SPREAD_BINS), axis=1)
    total = cumulative[:, -1:]
    low = (cumulative < 0.1 * total).sum(axis=1)  # the first bin reaching 10% of the rows
    high = (cumulative < 0.9 * total).sum(axis=1)
    return high - low + 1


def _continuous(flows: _InternalFlows, direction: np.ndarray, params: ParallelismParams) -> np.ndarray:
    """Per internal flow: a flow cache's record on a host pair whose records from its exporter,
    of one direction, cover `continuous_coverage` of the job's span or more (`ParallelismParams`).
    Per exporter: each keeps its own timeouts (a rail whose cache idles out after 10 ms reports
    a pipeline's transfers one by one beside a rail whose cache merges them for a minute)."""
    chosen = np.flatnonzero(flows.cached)
    if not len(chosen):
        return np.zeros(len(direction), bool)
    n_exporters = int(flows.exporter.max()) + 1
    exporter = flows.exporter[chosen]
    # the (direction, exporter) pairs with cached records; only those records are judged
    keys, of_key = unique_inverse(direction[chosen] * n_exporters + exporter)
    base = int(flows.start.min())
    span = max(int(flows.end.max()) - base, 1)
    width = span + 1
    # the union of each key's records: sorted by start with times offset per key, each record
    # adds what it reaches past the records before it
    start, end = flows.start[chosen], flows.end[chosen]
    # records usually come in start order: then a stable order by key alone (linear) is that
    order = stable_order(of_key) if np.all(start[1:] >= start[:-1]) else np.lexsort((start, of_key))
    ordered_key = of_key[order]
    opens = ordered_key * width + (start[order] - base)
    closes = ordered_key * width + (end[order] - base)
    reach = np.maximum.accumulate(closes)
    before = np.r_[np.iinfo(np.int64).min, reach[:-1]]
    added = np.maximum(closes - np.maximum(opens, before), 0)
    covered = np.r_[np.bincount(ordered_key, weights=added, minlength=len(keys)), 0.0]
    reverse = (flows.dst_host[chosen] * flows.n_hosts + flows.src_host[chosen]) * n_exporters + exporter
    at = np.minimum(np.searchsorted(keys, reverse), len(keys) - 1)
    reverse_covered = covered[np.where(keys[at] == reverse, at, len(keys))]
    # either direction: a pipeline's forward records may hold only the warm-up and the steady
    # phase's sends, its backward ones the rest of the step
    continuous = np.zeros(len(direction), bool)
    continuous[chosen] = np.maximum(covered[of_key], reverse_covered) >= params.continuous_coverage * span
    return continuous


def _reverse_open_at_both_ends(direction: np.ndarray, reverse_direction: np.ndarray, flows: _InternalFlows,
                               chosen: np.ndarray, params: ParallelismParams) -> np.ndarray:
    """Per `chosen` flow: was a record of the reverse direction (any size) in flight at its first
    packet and at its last (within `continuous_slack_ns`)? Asked as flows of no direction (one
    code past all) whose span is that instant."""
    asked = np.flatnonzero(chosen)
    nowhere = flows.n_hosts * flows.n_hosts
    n = len(direction)
    instants = np.r_[flows.start[asked], flows.end[asked]]
    in_flight = reverse_in_flight(
        np.r_[direction, np.full(len(instants), nowhere)],
        np.r_[np.full(n, nowhere), np.tile(reverse_direction[asked], 2)],
        np.r_[flows.start, instants], np.r_[flows.end, instants], params.continuous_slack_ns)
    return in_flight[n:n + len(asked)] & in_flight[n + len(asked):]


def _sampling_interval(direction: np.ndarray, flows: _InternalFlows) -> np.ndarray:
    """Per direction code: the median time between its consecutive sampled records (0 without).
    A sampled record marks one packet of a transfer, so the reverse transfer in flight with it
    shows up only about this often."""
    chosen = np.flatnonzero(flows.sampled)
    order = chosen[np.lexsort((flows.start[chosen], direction[chosen]))]
    same = direction[order][1:] == direction[order][:-1]
    gaps = np.diff(flows.start[order])[same]
    interval = np.zeros(flows.n_hosts * flows.n_hosts)
    if len(gaps):
        keys = direction[order][1:][same]
        median = group_median(keys, gaps.astype(np.float64))
        interval[keys] = median
    return interval


def size_families(size: np.ndarray, tolerance: float, min_flows: int) -> tuple[np.ndarray, np.ndarray]:
    """(smallest size of each family, family of every flow): the sizes that recur (`min_flows`
    records or more within `tolerance` of them), sorted, cut where the next is more than
    `tolerance` (relative) above its neighbour; every other size is a family of its own. Header
    bytes spread one transfer size over nearby byte counts, so no two records need to agree to the
    byte; sizes that do not recur (pieces of transfers an exporter cut) must not chain two sizes
    into one family."""
    sizes, size_code = unique_inverse(size)
    below = np.r_[0, np.cumsum(np.bincount(size_code, minlength=len(sizes)))]
    near = below[np.searchsorted(sizes, sizes * (1.0 + tolerance), side="right")] - below[
        np.searchsorted(sizes, sizes / (1.0 + tolerance), side="left")]
    recurring = np.flatnonzero(near >= min_flows)
    lone = np.flatnonzero(near < min_flows)
    opens = np.r_[True, sizes[recurring][1:] > sizes[recurring][:-1] * (1.0 + tolerance)][: len(recurring)]
    family = np.empty(len(sizes), np.int64)
    family[recurring] = np.cumsum(opens) - 1
    family[lone] = int(opens.sum()) + np.arange(len(lone))
    return np.r_[sizes[recurring][opens], sizes[lone]], family[size_code]


def family_sizes(nbytes: np.ndarray, params: ParallelismParams = DEFAULT_PARAMS) -> np.ndarray:
    """Smallest size of each flow's size family (`size_families` as `params` draw them): one
    transfer size however many header bytes each record counted."""
    smallest, family = size_families(nbytes, params.size_tolerance, params.pipeline_min_flows)
    return smallest[family]


def family_codes(nbytes: np.ndarray, params: ParallelismParams = DEFAULT_PARAMS) -> np.ndarray:
    """Each flow's size family numbered in order of its smallest size: `unique_inverse` of
    `family_sizes`, without hashing every flow's size again (each family's smallest size is its
    own, so the few families are ranked instead)."""
    smallest, family = size_families(nbytes, params.size_tolerance, params.pipeline_min_flows)
    rank = np.empty(len(smallest), np.int64)
    rank[np.argsort(smallest)] = np.arange(len(smallest))
    return rank[family]


def reverse_in_flight(
    direction: np.ndarray, reverse: np.ndarray, start: np.ndarray, end: np.ndarray,
    slack_ns: int | np.ndarray = DEFAULT_PARAMS.in_flight_slack_ns,
) -> np.ndarray:
    """For every flow: does a flow of the reverse direction overlap it (within `slack_ns`, one
    for all flows or one per flow)?

    All flows sorted by (direction, start) with times offset per direction, so one running
    maximum of ends serves every direction: a query only looks at its reverse direction's block.
    Flows usually come in start order: then ordering by direction alone (linear time) is that."""
    widest = int(np.max(slack_ns))
    base = int(start.min()) - widest - 1
    width = int(end.max()) - base + 2 * widest + 1

    def offset(block: np.ndarray, times: np.ndarray) -> np.ndarray:
        """block * width + (times - base), built in place: a job's flows make each such array
        hundreds of MB, and every temporary another"""
        placed = block * width
        placed += times
        placed -= base
        return placed

    in_start_order = bool(np.all(start[1:] >= start[:-1]))
    order = stable_order(direction) if in_start_order else np.argsort(offset(direction, start), kind="stable")
    ordered_direction = direction[order]
    ordered_reverse = reverse[order]
    ordered_start, ordered_end = start[order], end[order]
    starts = offset(ordered_direction, ordered_start)
    reach = offset(ordered_direction, ordered_end)
    np.maximum.accumulate(reach, out=reach)
    # queries by block keep the search cache-friendly: where every direction asks one reverse
    # block (a group's, a host pair's), in the flows' order already; else sorted by the block asked
    query_order = order
    if not np.all((ordered_reverse[1:] == ordered_reverse[:-1]) | (ordered_direction[1:] != ordered_direction[:-1])):
        query_order = stable_order(reverse)
        ordered_reverse, ordered_start, ordered_end = reverse[query_order], start[query_order], end[query_order]
    del order, ordered_direction
    slack = slack_ns[query_order] if np.ndim(slack_ns) else slack_ns
    query = offset(ordered_reverse, ordered_end)
    query += slack
    del ordered_end
    last = np.searchsorted(starts, query, side="right")
    del starts, query
    last -= 1
    answered = last >= 0
    np.maximum(last, 0, out=last)
    reached = reach[last]
    del reach, last
    opening = offset(ordered_reverse, ordered_start)
    opening -= slack
    answered &= reached >= opening
    del reached, opening
    in_flight = np.empty(len(answered), bool)
    in_flight[query_order] = answered  # answered in the queries' order, put back
    return in_flight


def _is_pipeline(groups: _Groups, params: ParallelismParams, all_to_all: np.ndarray) -> np.ndarray:
    """Per group: a pipeline's sends. Not the `all_to_all` groups, nor the sampled or cached
    records that follow them: an all-to-all's sends whose reverse records were lost read as a
    few unanswered sends, as a pipeline's do."""
    reverse_flows = np.where(groups.reverse >= 0, groups.flows[groups.reverse], 0)
    reverse_flows = reverse_flows + _merged_reverse_flows(groups, params)
    # a direction's sampled records estimate its bytes on the sampled rails; in transfers of a
    # group's size they count on both sides of its balance where both directions show the size
    # on timed rails too (with PXN a pipeline's forward sends may cross on timed rails and its
    # backward ones half on a sampled rail; a size one direction alone carries stays unbalanced,
    # whatever other traffic the samples hold)
    unsized = groups.lumped | groups.sampled
    counts_samples = ~unsized & (groups.size > 0) & (groups.reverse >= 0)

    def in_transfers(sampled_bytes: np.ndarray) -> np.ndarray:
        return np.divide(sampled_bytes, groups.size, out=np.zeros(len(groups.size)), where=counts_samples)

    own_flows = groups.flows + in_transfers(groups.sampled_bytes)
    reverse_flows = reverse_flows + in_transfers(groups.reverse_sampled_bytes)
    balanced = (reverse_flows * params.balance >= own_flows) & (own_flows * params.balance >= reverse_flows)
    repeated = groups.flows >= params.pipeline_min_flows
    # continuous records are judged with their reverse ones: the warm-up opens the forward
    # direction's records alone, the cool-down closes the backward direction's, and traffic at the
    # step's end merged into both (a tied embedding's sync on the pipeline's NICs) may hide one
    joint = groups.lumped & (groups.reverse >= 0)
    other = np.maximum(groups.reverse, 0)
    unmatched = np.where(joint, groups.unmatched + groups.unmatched[other], groups.unmatched)
    flows = np.where(joint, groups.flows + groups.flows[other], groups.flows)
    # a pipeline's unanswered sends recur; a collective's left unanswered for a while by a fault
    # do not (with PXN a tree's one direction may cross mostly on sampled rails, and a slow NIC
    # holds back its other one: both directions' counts then balance)
    short = groups.span_ns < params.recurrence_min_span_ns
    recurs = unsized | short | (groups.unmatched < params.recurrence_min_flows)
    recurs |= groups.unanswered_spread >= params.pipeline_recurrence
    pipeline = balanced & repeated & (unmatched >= params.pipeline_asymmetry * flows) & recurs
    pipeline &= ~all_to_all
    if not unsized.any():
        return pipeline
    # Where most of a host pair's records are transfer-sized (other exporters report its
    # transfers one by one), their groups decide, and its continuous and sampled records follow:
    # a cache whose idle timeout outlasts the steps merges a DP sync from step to step too, and a
    # tree's broadcast that ends after its reduce reads like a cool-down; a sampled packet finds a
    # reverse one in flight only by the luck of the draw, so a collective's samples read as a
    # few unanswered sends. Beside sampled rails, transfer-sized records decide wherever they are
    # enough to judge, however many samples the other rails make: those rails' exporters report
    # every transfer, where a cache reports alone only the transfers it happened to flush.
    n = int(max(groups.src_host.max(), groups.dst_host.max())) + 1
    pair = np.minimum(groups.src_host, groups.dst_host) * n + np.maximum(groups.src_host, groups.dst_host)
    sized = ~unsized
    sized_flows = np.bincount(pair[sized], weights=groups.flows[sized], minlength=n * n)
    unsized_flows = np.bincount(pair[unsized], weights=groups.flows[unsized], minlength=n * n)
    sized_pipeline = np.bincount(pair[sized & pipeline], minlength=n * n) > 0
    decided = unsized & np.where(groups.sampled, sized_flows[pair] >= params.pipeline_min_flows,
                                 sized_flows[pair] > unsized_flows[pair])
    pipeline[decided] = sized_pipeline[pair[decided]]
    return pipeline


def _merged_reverse_flows(groups: _Groups, params: ParallelismParams) -> np.ndarray:
    """Per group: the transfers of its size that the reverse direction's records hold merged (a
    record of a whole number k >= 2 of them counts k), so a pipeline whose one direction a flow
    cache merges is still balanced by volume. Compares the groups of each host pair pairwise:
    O(recurring groups x groups) per host pair, and a host pair carries few sizes."""
    n = int(max(groups.src_host.max(), groups.dst_host.max())) + 1
    direction = groups.src_host * n + groups.dst_host
    by_direction = np.argsort(direction, kind="stable")
    directions, first, count = np.unique(direction[by_direction], return_index=True, return_counts=True)
    reverse_direction = groups.dst_host * n + groups.src_host
    where = np.minimum(np.searchsorted(directions, reverse_direction), len(directions) - 1)
    has_reverse = directions[where] == reverse_direction
    # only a group the reverse group does not balance by itself: its own pipeline's other
    # direction may be merged, and other traffic on the pair is left out of a balanced one
    own = np.where(groups.reverse >= 0, groups.flows[groups.reverse], 0)
    short = own * params.balance < groups.flows
    units = np.flatnonzero(has_reverse & short & (groups.flows >= params.pipeline_min_flows) & ~groups.lumped)
    span = count[where[units]]
    unit = np.repeat(units, span)
    offset = np.arange(len(unit)) - np.repeat(np.cumsum(span) - span, span)
    other = by_direction[np.repeat(first[where[units]], span) + offset]
    ratio = groups.size[other] / groups.size[unit]
    whole = _whole_multiple(ratio, params.size_tolerance)
    # a size both directions carry about equally is a transfer size of its own (pipelines of
    # several activation sizes), not merged records
    echo = np.where(groups.reverse[other] >= 0, groups.flows[groups.reverse[other]], 0)
    whole &= echo * params.balance < groups.flows[other]
    # and merged records recur like the transfers they hold; a garbled size is near some multiple
    whole &= (groups.flows[other] >= params.pipeline_min_flows) & ~groups.lumped[other]
    return np.bincount(unit[whole], weights=(np.round(ratio) * groups.flows[other])[whole], minlength=len(groups.flows))


def _whole_multiple(ratio: np.ndarray, tolerance: float) -> np.ndarray:
    """Is each size ratio a whole number of 2 or more transfers, off by `tolerance` of one at
    most? (A looser bound makes any large size a multiple of every small one by chance.)"""
    return (np.round(ratio) >= 2) & (np.abs(ratio - np.round(ratio)) <= tolerance)


def _merged_pipeline_sends(
    flows: _InternalFlows, groups: _Groups, pipeline: np.ndarray, params: ParallelismParams
) -> np.ndarray:
    """Per internal flow: a record of several pipeline sends merged (a flow cache keeps a queue
    pair's record open across transfers). On a host pair with a PP group, a record outside it
    that holds a whole number (2 or more) of its activations carries the pipeline too: by volume,
    as its size is no transfer's. (Not by rate: real transfers of other kinds on the pair, slowed
    by their peers, run as slowly as merged records.)"""
    n = flows.n_hosts
    pair_of_group = np.minimum(groups.src_host, groups.dst_host) * n + np.maximum(groups.src_host, groups.dst_host)
    unit = np.full(n * n, np.inf)
    sized = pipeline & ~groups.lumped
    np.minimum.at(unit, pair_of_group[sized], groups.size[sized].astype(np.float64))
    pair = pair_of_group[groups.of_flow]
    piped = np.isfinite(unit[pair]) & ~pipeline[groups.of_flow] & ~groups.lumped[groups.of_flow]
    if not piped.any():
        return piped
    units = flows.size / unit[pair]
    whole = _whole_multiple(units, params.size_tolerance) & (groups.flows[groups.of_flow] > 1)
    return piped & whole


def _is_all_to_all(groups: _Groups, params: ParallelismParams) -> np.ndarray:
    """Groups in a family of `moe_family` or more sizes on one directed host pair: sizes that,
    sorted, lie within `size_step` of the next (draws around one volume per peer), with flow counts
    that agree within `family_spread` (every size comes up about as often). That is the MoE all-to-all: a pipeline
    repeats one activation size, gradient buckets bring a full size and a tail, ZeRO adds the
    parameter gather, and the DP sync that shares the pair keeps sizes far from the family's."""
    n_groups = len(groups.flows)
    direction = groups.src_host * (groups.dst_host.max() + 1) + groups.dst_host
    order = np.lexsort((groups.size, direction))
    size, pair = groups.size[order], direction[order]
    new_run = np.ones(n_groups, bool)
    new_run[1:] = (pair[1:] != pair[:-1]) | (size[1:] > params.size_step * size[:-1])
    run = np.empty(n_groups, np.int64)
    run[order] = np.cumsum(new_run) - 1
    log_flows = np.log(groups.flows)
    spread = np.log(params.family_spread)
    width = log_flows.max() - log_flows.min() + 4 * spread
    position = run * width + (log_flows - log_flows.min())
    ordered = np.sort(position)
    family = np.searchsorted(ordered, position + spread, side="right") - np.searchsorted(ordered, position - spread)
    core = family >= params.moe_family
    # and the family's rarer sizes: behind a flow cache a record may sum a few draws, spreading the
    # sizes over a bell whose tails come up less often than its middle (they read as a pipeline's
    # sizes, balanced both ways). A size of the run no rarer than the family's middle is a
    # collective of its own that shares the pair (a DP bucket, an activation)
    least = np.full(int(run.max()) + 1, np.inf)
    np.minimum.at(least, run[core], groups.flows[core])
    return core | (np.isfinite(least[run]) & (groups.flows < least[run]))


@dataclass
class _Layout:
    """Degrees and, per member GPU, pipeline stage and DP rank (Megatron order: rank = tp_rank +
    tp * (dp_rank + dp * pp_stage), consecutive ranks on a host)."""

    dp: int
    pp: int
    tp: int
    host_stage: np.ndarray  # per host code: the first stage it holds
    pp_stage: np.ndarray  # per member GPU
    dp_rank: np.ndarray
    writers: tuple[int, int]  # checkpoint writers (fewest, most) tp was told by; (0, 0): none
    n_gpus: int  # the job's GPUs on its hosts at their last sighting

    @classmethod
    def infer(
        cls, gpus: pa.Table, flows: _InternalFlows, external: pa.Table, groups: _Groups, pipeline: np.ndarray,
        pipeline_sends: np.ndarray, all_to_all: np.ndarray, remembered_writers: tuple[int, int] = (0, 0),
    ) -> _Layout:
        host_code = gpus["host_code"].to_numpy()
        gpu = gpus["local"].to_numpy()
        active = gpus["active"].to_numpy(zero_copy_only=False)
        served = gpus["gpus"].to_numpy()
        # the job's own GPUs: on each host still in it, those its NICs serve (hosts may differ:
        # the most common count is the job's per host)
        n_gpus = int(served[active].sum())
        per_host_counts = np.bincount(host_code[active], weights=served[active]).astype(np.int64)
        counts, hosts_with = np.unique(per_host_counts[per_host_counts > 0], return_counts=True)
        gpus_per_host = int(counts[np.argmax(hosts_with)])
        active_hosts = np.zeros(flows.n_hosts, bool)
        active_hosts[host_code[active]] = True
        level = _pipeline_levels(flows, groups, pipeline, active_hosts, ~pipeline & ~all_to_all)
        n_levels = int(level.max()) + 1
        on_forward = pipeline_sends & (level[flows.dst_host] == level[flows.src_host] + 1)
        forward_gpus = int(np.minimum(_gpus_behind_rails(flows, on_forward, flows.src_host),
                                      _gpus_behind_rails(flows, on_forward, flows.src_host, receiving=True)).max(initial=0))
        if 0 < forward_gpus < gpus_per_host:
            # Stages smaller than the job's part of a host: a forward send reaches the first GPUs
            # of the next host, one stage's (of one pipeline, in tp-pp-dp order: its TP group), and
            # every host of a chain holds as many stages. Pipelines side by side (tp-pp-dp order)
            # are chains of their own, so the stages are the chain's, not the job's GPUs over them.
            stages_on_host = gpus_per_host // forward_gpus
            pp = max(n_levels * stages_on_host, 1)
            block = forward_gpus
        else:
            pp = n_levels
            stages_on_host = 1
            block = gpus_per_host
        stage_size = max(n_gpus // pp, 1)
        collective = ~pipeline & ~all_to_all & (level[groups.src_host] == level[groups.dst_host])
        writers = _checkpoint_writers(external, gpus, level, gpus_per_host)
        if not any(writers):
            writers = remembered_writers
        tp = _tensor_parallel(flows, groups, collective, stage_size, writers, pp, block)
        dp = max(stage_size // tp, 1)
        stages_per_host = stages_on_host
        if block < gpus_per_host:
            pp_stage = level[host_code] * stages_per_host + gpu // block
            rank_in_stage = gpu % block
        else:
            pp_stage = level[host_code]
            rank_in_stage = _slot_in_stage(host_code, level) * gpus_per_host + gpu
        return cls(
            dp=dp,
            pp=pp,
            tp=tp,
            host_stage=level * stages_per_host,
            pp_stage=pp_stage,
            dp_rank=(rank_in_stage // tp) % dp,
            writers=writers,
            n_gpus=n_gpus,
        )


def _pipeline_levels(
    flows: _InternalFlows, groups: _Groups, pipeline: np.ndarray, active: np.ndarray, collective: np.ndarray
) -> np.ndarray:
    """Stage index of every host along its PP chain (0 where there is no PP traffic); `active`:
    per host code, still in the job at its last sighting; `collective`: per group, traffic of a
    collective (not PP, not an all-to-all), which ties the hosts of one stage in different
    pipelines together (their DP sync)."""
    chosen = np.flatnonzero(pipeline[groups.of_flow])
    src, dst = flows.src_host[chosen], flows.dst_host[chosen]
    low = np.minimum(src, dst)
    pair = low * flows.n_hosts + np.maximum(src, dst)
    upward = np.where(src == low, 1.0, -1.0)
    pairs, index = unique_inverse(pair)
    # the pairs' ranks in place of their codes: the same order, sorted in one radix pass
    vote = warm_up_votes(index, flows.start[chosen], groups.answered[chosen])
    upward_score = np.bincount(index, weights=upward * vote, minlength=len(pairs))
    warm_ups = np.bincount(src, weights=vote > 0, minlength=flows.n_hosts)
    level = _chain_levels(pairs // flows.n_hosts, pairs % flows.n_hosts, upward_score, warm_ups, active)
    return _aligned_chains(level, flows, groups, collective, src, dst, vote)


def _aligned_chains(
    level: np.ndarray, flows: _InternalFlows, groups: _Groups, collective: np.ndarray, src: np.ndarray,
    dst: np.ndarray, forward: np.ndarray,
) -> np.ndarray:
    """Levels of several pipelines turned so that their stages line up. Each chain is numbered
    from the end its own warm-up votes call first, but a chain may have no votes (sends too short
    for any to overlap the reverse direction's: then it is numbered from whichever end comes
    first) or few; the DP sync of a stage runs between the hosts of that stage in every pipeline,
    so chains of one length are turned (rings also rotated) to carry their collective traffic
    between equal levels: each chain, most voted first, the way that agrees best with those turned
    before it; then all together the way their summed votes call (a ring keeps its warm-up start).
    `src`, `dst`: the host codes of the PP flows; `forward`: their warm-up votes (+1 forward, -1
    backward, 0 neither)."""
    if len(src) == 0:
        return level
    # chains: connected components of the PP host pairs
    # the distinct (src, dst) host pairs in order, by hashing their codes (np.unique over rows
    # sorts every flow's pair as a structured value)
    hop_codes = unique_counts(src * flows.n_hosts + dst)[0]
    hops = np.stack(np.divmod(hop_codes, flows.n_hosts), axis=1)
    on_chain = np.zeros(flows.n_hosts, bool)
    on_chain[hops[:, 0]] = on_chain[hops[:, 1]] = True
    chain_of = connected(hops[:, 0], hops[:, 1], flows.n_hosts)
    chains = [np.flatnonzero(on_chain & (chain_of == c)) for c in np.unique(chain_of[on_chain])]
    depth = {c: int(level[hosts].max()) for c, hosts in zip(range(len(chains)), chains)}
    lengths, count = np.unique([d for d in depth.values() if d > 0], return_counts=True)
    if not len(lengths) or count.max() < 2:
        return level
    # collective flows between hosts of the job: (host, host) -> flows, both directions together
    shared = np.flatnonzero(collective[groups.of_flow] & (flows.src_host != flows.dst_host))
    weight: dict[tuple[int, int], int] = {}
    low = np.minimum(flows.src_host[shared], flows.dst_host[shared])
    high = np.maximum(flows.src_host[shared], flows.dst_host[shared])
    keys, n = unique_counts(low * flows.n_hosts + high)
    for key, k in zip(keys.tolist(), n.tolist()):
        weight[divmod(key, flows.n_hosts)] = k
    level = level.copy()
    # per chain: its warm-up votes as numbered (> 0: its level 0 opens the steps)
    along = forward * np.sign(level[dst] - level[src])
    votes = np.bincount(chain_of[src], weights=along, minlength=flows.n_hosts)
    hop_levels = {(int(chain_of[a]), int(level[a]), int(level[b])) for a, b in hops.tolist()}
    for length in lengths[count >= 2].tolist():
        members = [hosts for c, hosts in enumerate(chains) if depth[c] == length]
        members.sort(key=lambda hosts: -abs(votes[chain_of[hosts[0]]]))
        turned: list[np.ndarray] = []
        for hosts in members:
            if turned:
                # an interleaved pipeline's chain closes into a ring (its last stage sends back
                # to the first): it may be numbered from any of its hosts, either way round
                ring = length > 1 and (int(chain_of[hosts[0]]), 0, length) in hop_levels
                ways = ([(sign, shift) for sign in (1, -1) for shift in range(length + 1)] if ring
                        else [(1, 0), (-1, length)])
                agree = np.zeros(len(ways))
                for other in turned:
                    for a in hosts.tolist():
                        for b in other.tolist():
                            w = weight.get((min(a, b), max(a, b)), 0)
                            if w:
                                agree += [w * ((sign * level[a] + shift) % (length + 1) == level[b])
                                          for sign, shift in ways]
                sign, shift = ways[int(np.argmax(agree))]
                level[hosts] = (sign * level[hosts] + shift) % (length + 1)
            turned.append(hosts)
        together = np.concatenate(turned)
        mine = np.isin(src, together)
        ring = length > 1 and any((int(chain_of[hosts[0]]), 0, length) in hop_levels for hosts in members)
        if not ring and (forward * np.sign(level[dst] - level[src]))[mine].sum() < 0:
            level[together] = length - level[together]
    return level


def warm_up_votes(pair: np.ndarray, start: np.ndarray, answered: np.ndarray) -> np.ndarray:
    """Per PP flow: +1 for a warm-up forward, -1 for a cool-down backward, 0 otherwise.

    Flows with no reverse traffic in flight open a step (warm-up forwards, followed closely by the
    steady exchanges) or close it (cool-down backwards, preceded closely by them)."""
    vote = np.zeros(len(pair))
    if answered.all() or not answered.any():
        return vote
    base = int(start.min())
    width = int(start.max()) - base + 1
    key = pair * width + (start - base)
    # flows usually come in start order: then ordered by pair alone (linear passes) the keys are sorted
    by_key = stable_order(pair, scattered=True) if np.all(start[1:] >= start[:-1]) else np.argsort(key, kind="stable")
    key, answered = key[by_key], answered[by_key]
    # per lone flow in key order, the last exchange's key before it (-1 at least) and the first's
    # after it: the exchanges' keys (sorted) read at the count of exchanges ahead of it, its place
    # less the lone flows ahead of it (no running extremes over every flow, no search)
    exchanges = key[answered]
    lone = np.flatnonzero(~answered)
    ahead = lone - np.arange(len(lone))
    at = key[lone]
    previous = np.where(ahead > 0, np.maximum(exchanges[np.maximum(ahead - 1, 0)], -1), -1)
    following = np.where(ahead < len(exchanges), exchanges[np.minimum(ahead, len(exchanges) - 1)],
                         np.iinfo(np.int64).max)
    block = at - at % width  # this pair's exchanges lie in [block, block + width)
    far = 2 * width  # no exchange on that side
    since = np.where(previous >= block, at - previous, far)
    until = np.where(following < block + width, following - at, far)
    # an exchange starting with the lone flow follows it, whichever of the two the order put first
    tied = previous == at
    since[tied], until[tied] = far, 0
    vote[by_key[lone]] = np.sign(since - until)
    return vote


def _chain_levels(
    low: np.ndarray, high: np.ndarray, upward_score: np.ndarray, warm_ups: np.ndarray, active: np.ndarray
) -> np.ndarray:
    """Walk every PP chain depth-first from one end, then number its hosts from the end whose
    sends the warm-up votes call forward (summed over the chain, so one noisy hop cannot flip
    part of it). A host that a restart replaced has the same neighbours as its successor: it is
    walked as that host and shares its stage (hosts both still in the job may share neighbours
    too: every other host of a ring of four). An interleaved pipeline (virtual stages) sends
    from its last stage back to the first, so its chain closes into a ring: that is walked from
    the host sending the most warm-up forwards (stage 0 runs the longest warm-up) in the
    direction its votes call forward."""
    neighbours: dict[int, set[int]] = {}
    for a, b in zip(low.tolist(), high.tolist()):
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    successor = {frozenset(near): host for host, near in sorted(neighbours.items(), reverse=True) if active[host]}
    walked_as = {host: host if active[host] else successor.get(frozenset(near), host)
                 for host, near in neighbours.items()}
    score: dict[tuple[int, int], float] = {}
    for a, b, value in zip(low.tolist(), high.tolist(), upward_score.tolist()):
        a, b = walked_as[a], walked_as[b]
        score[(a, b)] = score.get((a, b), 0.0) + value
        score[(b, a)] = score.get((b, a), 0.0) - value
    steps = {host: sorted({walked_as[n] for n in neighbours[host]}) for host in set(walked_as.values())}
    level = np.zeros(len(active), np.int64)
    depth = np.full(len(active), -1, np.int64)
    for end in sorted(steps, key=lambda host: (len(steps[host]), host)):
        if depth[end] >= 0:
            continue
        chain, toward_far_end, stack = [], 0.0, [end]
        depth[end] = 0
        while stack:
            host = stack.pop()
            chain.append(host)
            for nxt in steps[host]:
                if depth[nxt] < 0:
                    depth[nxt] = depth[host] + 1
                    toward_far_end += score[(host, nxt)]
                    stack.append(nxt)
        if len(chain) > 2 and all(len(steps[host]) == 2 for host in chain):
            chain = _ring_order(chain, steps, score, warm_ups)
            depth[chain] = np.arange(len(chain))
            toward_far_end = 0.0
        chain = np.array(chain)
        level[chain] = depth[chain] if toward_far_end >= 0 else depth[chain].max() - depth[chain]
    for host, walked in walked_as.items():
        level[host] = level[walked]
    return level


def _ring_order(
    ring: list[int], steps: dict[int, list[int]], score: dict[tuple[int, int], float], warm_ups: np.ndarray
) -> list[int]:
    """The hosts of a ring of PP hops in stage order: from the host with the most warm-up sends,
    on along the forward direction."""
    first = max(ring, key=lambda host: (warm_ups[host], -host))
    order = [first, max(steps[first], key=lambda nxt: score[(first, nxt)])]
    while len(order) < len(ring):
        order.append(next(nxt for nxt in steps[order[-1]] if nxt != order[-2]))
    return order


def _checkpoint_writers(external: pa.Table, gpus: pa.Table, level: np.ndarray, gpus_per_host: int) -> tuple[int, int]:
    """How many GPUs write the checkpoint, (fewest, most): the largest flow size (size family,
    `family_sizes`) that the most member NICs each send to a non-member more than once (shards go
    out in equal chunks; log writes never repeat a size), and the NICs whose sampled records
    (`sampled`: a sampler's estimates, of no size to repeat) hold two checkpoint-sized sends or
    more. One NIC is one writer: a job with tp = pp = 1 saves from DP rank 0 alone.
    Counted per (stage level, GPU index), so a host replaced in a restart counts once.
    `external`: the members' checkpoint-sized sends to non-members (bytes, src_addr, sampled)."""
    if external.num_rows == 0:
        return 0, 0
    # one chunk size as exporters count it: header bytes put each record a few bytes apart; a
    # sampler's records are one family of their own
    family = np.where(external["sampled"].to_numpy(zero_copy_only=False), -1,
                      family_sizes(external["bytes"].to_numpy()))
    per_nic = pa.table({"bytes": family, "src_addr": external["src_addr"]}).group_by(
        ["bytes", "src_addr"], use_threads=False).aggregate([("bytes", "count")])
    per_nic = per_nic.filter(pc.greater_equal(per_nic["bytes_count"], 2))
    if per_nic.num_rows == 0:
        return 0, 0
    sizes, writers_of = np.unique(per_nic["bytes"].to_numpy(), return_inverse=True)
    row = pc.index_in(per_nic["src_addr"], value_set=gpus["addr"]).to_numpy()
    slot = level[gpus["host_code"].to_numpy()[row]] * gpus_per_host + gpus["local"].to_numpy()[row]
    served = gpus["gpus"].to_numpy()[row]  # a NIC serving two GPUs writes both shards
    distinct, first = unique_rows(writers_of.ravel(), slot, return_index=True)
    writers = np.bincount(distinct[:, 0], weights=served[first], minlength=len(sizes))
    # the size with the most writers, then the largest (the sampled family only without one);
    # a NIC whose samples show checkpoint-sized sends wrote that size too
    sized = sizes >= 0
    best = np.lexsort((sizes, np.where(sized, writers, -1)))[-1]
    chosen = (writers_of.ravel() == best) | ~sized[writers_of.ravel()]
    _, first = np.unique(slot[chosen], return_index=True)
    # a NIC serving two GPUs may write one shard or both: the writers are between the NICs and their GPUs
    return len(first), int(served[chosen][first].sum())


def _tensor_parallel(
    flows: _InternalFlows, groups: _Groups, collective: np.ndarray, stage_size: int, writers: tuple[int, int],
    pp: int, gpus_per_host: int,
) -> int:
    """tp, from the first of these clues that the traffic offers:
    1. the checkpoint: DP rank 0 of every (stage, TP rank) writes its shard, so tp * pp GPUs write;
    2. DP traffic between hosts: every crossing of a DP ring or tree edge between two hosts carries
       one flow per TP rank, on the rail of the receiving GPU (PXN), so the fewest rails any directed
       DP host pair uses is tp (exact for rings; a tree may cross twice between two hosts);
    3. otherwise the stage's DP stays on NVLink inside a host and tp takes the whole stage (dp = 1),
       the usual choice (TP needs NVLink, DP does not)."""
    # TP rides NVLink: it divides the job's GPUs on a host
    fits = [tp for tp in range(gpus_per_host, 0, -1) if gpus_per_host % tp == 0 and stage_size % tp == 0]
    fewest, most = writers
    by_writers = [w // pp for w in range(most, fewest - 1, -1) if w and w % pp == 0 and w // pp in fits]
    chosen = collective[groups.of_flow] & (flows.src_host != flows.dst_host)
    by_rails = None
    if stage_size > gpus_per_host and chosen.any():
        pair = flows.src_host * flows.n_hosts + flows.dst_host
        # a NIC serving two GPUs counts both, whichever of them the crossing is: the host pair's
        # end with one GPU per NIC tells the TP ranks exactly
        crossing = np.minimum(_gpus_behind_rails(flows, chosen, pair),
                              _gpus_behind_rails(flows, chosen, pair, receiving=True))
        by_rails = next(tp for tp in fits if tp <= crossing.min())
    if by_writers:
        # writers on NICs serving two GPUs leave a choice: the rails settle it where they can
        return by_rails if len(by_writers) > 1 and by_rails in by_writers else by_writers[0]
    return fits[0] if by_rails is None else by_rails


def _gpus_behind_rails(flows: _InternalFlows, chosen: np.ndarray, key: np.ndarray,
                       receiving: bool = False) -> np.ndarray:
    """Per distinct `key` of the `chosen` flows: the GPUs served by the distinct rails (source
    NICs, or the destination NICs when `receiving`) those flows leave through (a NIC may serve
    two GPUs, and carry both GPUs' sends)."""
    nic = (flows.dst if receiving else flows.src)[chosen]
    key = key[chosen]
    # each member's (rail, gpus) as one code, so a flow's is one lookup
    rail_and_gpus = combined_key(flows.rail_of_member, flows.gpus_of_member)
    # the distinct (key, rail, gpus) triples, by hashing packed integers (np.unique over rows
    # sorts every flow's triple as a structured value: ~10x slower)
    _, triple = unique_inverse(combined_key(key, rail_and_gpus[nic]))
    row = np.empty(int(triple.max(initial=-1)) + 1, np.int64)
    row[triple] = np.arange(len(triple))  # any row of each triple: they are equal
    _, of_key = np.unique(key[row], return_inverse=True)
    return np.bincount(of_key.ravel(), weights=flows.gpus_of_member[nic[row]]).astype(np.int64)


def _slot_in_stage(host_code: np.ndarray, level: np.ndarray) -> np.ndarray:
    """Position of each GPU's host among the hosts of its stage, in host name order."""
    hosts = np.unique(host_code)
    order = np.lexsort((hosts, level[hosts]))
    ranked = hosts[order]
    first_of_level = np.searchsorted(level[ranked], level[ranked])
    slot = np.empty(host_code.max() + 1, np.int64)
    slot[ranked] = np.arange(len(ranked)) - first_of_level
    return slot[host_code]


def _comm_pairs(job_id: str, job_flows: pa.Table, src: np.ndarray, addrs: pa.ChunkedArray | pa.Array,
                kind: np.ndarray) -> pa.Table:
    """The flows' (source, destination, kind) pairs; `src`: each flow's source's row of `addrs`."""
    # grouped by the source's, the destination's and the kind's codes, named on the pairs: a name
    # per flow costs more to make and to hash
    dst, dst_names = encoded(job_flows, "dst_addr")
    table = pa.table({"src_addr": src, "dst_addr": pa.array(dst, mask=dst < 0), "kind": kind,
                      "bytes": job_flows["bytes"]})
    grouped = table.group_by(["src_addr", "dst_addr", "kind"], use_threads=False).aggregate(
        [("bytes", "count"), ("bytes", "sum"), ("bytes", "count_distinct")]
    )
    for name, names in (("src_addr", addrs), ("dst_addr", dst_names), ("kind", pa.array(COMM_KINDS))):
        grouped = grouped.set_column(grouped.schema.get_field_index(name), name, names.take(grouped[name]))
    grouped = grouped.rename_columns(
        {"bytes_count": "flows", "bytes_sum": "bytes", "bytes_count_distinct": "distinct_sizes"}
    )
    grouped = grouped.append_column("job_id", pa.array([job_id] * grouped.num_rows, pa.string()))
    keys = [("src_addr", "ascending"), ("dst_addr", "ascending"), ("kind", "ascending")]
    return conform(grouped.sort_by(keys), COMM_PAIRS)
