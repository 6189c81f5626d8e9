"""Every number job recognition decides with, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from prism_core.constants import NS_PER_S
from prism_core.minutes import MINUTE_NS, PAIR_PAUSE_NS


@dataclass(frozen=True)
class RecognitionParams:
    """Thresholds and priors of recognition and tracking. A *threshold* is policy: a line Prism
    has to draw somewhere. A *prior* is a property of a job, assumed for every job until it can
    be learned from the job's own traffic. Checkpoint saves are told by the size every stage
    shares, `prism_core.constants.CHECKPOINT_FLOW_BYTES`."""

    # threshold, share of the union of two host sets: components of one minute whose host sets
    # are at least this similar (Jaccard) are one job, one component per rail over the same hosts.
    jaccard: float = 0.5
    # Components on the same hosts are one job only when the traffic says so (merge.one_job):
    # threshold, ns: they keep in step, their traffic of a minute starting and ending within this
    # much of each other (a job's rails carry its collectives and sends at the same moments, apart
    # by exporters' clock offsets of a few ms; another job at the phase of its own steps)
    in_step_ns: int = 100_000_000
    # threshold, share of minutes: in at least this share of the minutes they meet in this hour;
    in_step_share: float = 0.5
    # threshold, share of a flow size: or they carry a flow size in common, within this share
    # (exporters that count per-packet headers and those that do not differ by about 1%): a job's
    # parts with other roles in a step carry its activations;
    same_size: float = 0.02
    # threshold, ns: and begin and end their traffic this hour within this much of each other (a
    # rail with only the DP sync first talks at the end of the first step, tens of seconds in),
    # since many models share an activation size but a job arriving beside another begins later.
    same_life_ns: int = MINUTE_NS
    # threshold, ns: a part's life ends where its anchor NIC falls silent this long: a later job on
    # the same NICs lives a life of its own (two jobs side by side on the hosts would otherwise
    # share the life of whatever ran on their NICs to the hour's end). Behind a flow cache a busy
    # pair's records come an active timeout apart (up to a minute) at the phase of the rail's own
    # leaf, so a running job's NIC can be silent for over a minute.
    life_gap_ns: int = 2 * MINUTE_NS
    # threshold, ns, and a multiple of the NIC's usual pause: a NIC whose traffic usually runs on
    # from one minute into the next stops sooner, after a silence this long and this many times its
    # median pause between minutes (a sync-only rail of a job with long steps, or records behind a
    # flow cache, pause as a matter of course): a job arriving on NICs another left seconds before
    # lives a life of its own. A job's stall or unseen checkpoint save may end the lives of all of
    # its parts at once; they begin again together. But behind flow caches only some of its parts
    # show such a pause (a rail whose cache ends its records at the pause; another's holds them
    # through it): the floor is above a save's pause (17 s on `small` behind caches; at 10 s a
    # rail that showed one lived a life of its own and became a job of its own).
    life_pause_floor_ns: int = 30 * NS_PER_S
    life_pause_factor: float = 4.0
    # threshold, share of a part's rows this hour: a part is told by its sizes only when at least
    # this share of its rows carry a size recurring byte for byte; behind flow caches (sums),
    # packet samplers (estimates) and header-counting exporters sizes tell nothing, and the parts
    # on the same hosts living the same life are one job. Likewise by its timing only when this
    # share of its minutes end their records within the minute (`in_step_ns`): a cache holding a
    # flow past the minute shows neither when the part's traffic starts nor when it ends.
    sized_share: float = 0.5
    # threshold, ns: pauses up to this long inside one NIC's traffic of a minute are bridged; longer
    # ones separate a job that stopped from one that started on the same hosts within the minute.
    # The silence that splits a pair's flow_minutes rows (minutes.PAIR_PAUSE_NS), so both agree.
    segment_gap_ns: int = PAIR_PAUSE_NS
    # threshold, flows: a row is job traffic when its top flow size repeats this often in the
    # minute; activations and gradient buckets repeat every micro-batch and step, one-off
    # background transfers do not.
    min_repeated_flows: int = 2
    # threshold, minutes: or when its NIC pair carries traffic in this many minutes of the hour,
    # whatever the sizes (records of flow caches and packet samplers repeat none); a one-off copy
    # between two jobs' NICs takes seconds, two minutes where it crosses a minute's end.
    persistent_minutes: int = 3
    # threshold, share of the smaller host set: a minute's job continues a running job sharing
    # this much of it.
    track_overlap: float = 0.5
    # threshold, ns: traffic on a job's hosts continues the job without comparing flow sizes only
    # within this much silence and on exactly the job's hosts: a new job can start on all or part
    # of the hosts another left seconds before.
    resume_check_ns: int = 10 * NS_PER_S
    # threshold, ns: traffic on a running job's NICs that begins this much or more before the job's
    # last traffic ended continues it whatever its flow sizes: a NIC serves one job at a time, so a
    # new job on the NICs begins after the old one's last record, give or take the exporters' clock
    # offsets of a few ms; a flow-cache record of the job (active timeouts up to a minute) reaches
    # into the next minute, and its sizes, sums of several transfers, recur in no other minute.
    continuing_overlap_ns: int = 100_000_000
    # threshold, share of the union of two NIC sets: traffic within `resume_check_ns` on NICs this
    # similar (Jaccard) to a running job's is the job without comparing sizes, as on exactly its
    # NICs: exporters that lose records or sample packets leave a few of a job's NICs silent in a
    # minute, while a new job on part of the NICs another left covers a part of them.
    same_nics_jaccard: float = 0.9
    # prior: a job holds as many GPUs on each of its hosts, an aligned block of a power of two
    # (launchers start the same number of ranks per node; schedulers hand out GPUs in blocks that
    # share a PCIe switch or NVLink group). A job on part of its hosts shows only some of its NICs
    # (with PXN a block's first GPU carries a ring's traffic to and from the next host, the others
    # talk over NVLink), so it holds on every host the block as wide as it shows on its widest
    # (`Tracker.gpu_blocks`); False: each such job keeps the NICs it showed.
    same_gpus_per_host: bool = True
    # threshold: a platform hands out GPUs, not hosts, in an hour when at least this many hosts
    # each hold two jobs with different hosts at once for longer than `young_ns`
    # (`Tracker.hands_out_gpus`); pieces of one job hold its hosts, and two hosts may be the ends
    # of a link between pieces that recognition has not joined yet
    shared_hosts: int = 3
    # prior, ns: how long a job may show its parts apart (pipelines before its first DP sync joins
    # them); tracks begun this recently may still be parts of one job not yet seen whole.
    young_ns: int = 3 * MINUTE_NS
    # threshold, ns: silence longer than this between a job's flows is a stop; resuming after it
    # is a restart.
    restart_gap_ns: int = 60 * NS_PER_S
    # threshold, ns: a stopped job that resumes within this long on its hosts is restarted; a
    # stopped job is carried to the next hour for as long.
    restart_window_ns: int = 30 * MINUTE_NS
    # threshold, hosts: a restart may replace this many of the job's hosts (a failed node swapped).
    replaced_hosts: int = 1
    # threshold, share of bytes: a resumed job is the stopped one when this share of its repeated
    # bytes is in flow sizes the stopped job also used.
    signature_match: float = 0.5
    # threshold, 1-in-N: a row whose records were sampled 1 in more than this many packets holds
    # a sampler's estimate of its bytes (sampled packets x rate), recurring without being any
    # transfer's size; sampled 1 in a few, a transfer's bytes are counted to a few bytes
    # (resolution's `max_sampling_rate` draws the same line)
    estimated_sampling_rate: int = 16
    # threshold, share of a flow size: a job's signature holds a size within this much of another
    # as that one. One exporter counting header bytes per packet spreads a transfer size by ~0.1%
    # from record to record (its packets' headers average out); two jobs' transfer sizes a few
    # tenths of a percent apart are rare, a percent or two apart common (models share shapes).
    signature_size_share: float = 0.0025
    # threshold, sizes: flow sizes kept per job as its signature, most flows first.
    signature_sizes: int = 32
    # threshold, minutes: a job is known by the sizes seen in this many minutes or more, once
    # there are any; a minute where one job ends and the next starts on the same pairs mixes both.
    established_minutes: int = 2
    # prior, ns: a new job's first collective reaches all its host pairs within this long, so on
    # a hand-over within a minute its traffic on pairs both jobs used starts this much before its
    # first traffic on pairs of its own.
    handover_lead_in_ns: int = PAIR_PAUSE_NS


DEFAULT_PARAMS = RecognitionParams()
