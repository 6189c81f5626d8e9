"""Queue pairs: whether a job's transfers after a silence run on the connections they ran on before.

An RDMA transfer runs on a queue pair, and a RoCEv2 NIC derives the UDP source port of its packets
from the queue pair (ECMP entropy), so a flow record's (source, destination, source port) names
the connection. A job whose processes restarted connects anew: its queue pairs, so its source
ports, are new. A job that only paused (a checkpoint saved over a network the flow logs do not
see, a stall) resumes on the connections it had. Records without ports tell nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prism_core.arrays import MAX_DENSE_SPAN_PER_VALUE, combined_key, lookup, stable_order, unique_inverse
from prism_core.constants import NS_PER_S

PORT_BITS = 17  # a source port (0-65535, -1: none) in the low bits of a key beside its pair's


def source_ports(flows: pa.Table, rows: np.ndarray) -> np.ndarray:
    """The source port of each of `rows` of `flows` (-1 where the record has none, or no record
    has ports)."""
    if "src_port" not in flows.column_names:
        return np.full(len(rows), -1, np.int32)
    return pc.fill_null(flows["src_port"], -1).to_numpy().astype(np.int32)[rows]


def resumed_on_same_connections(src: np.ndarray, dst: np.ndarray, port: np.ndarray, start: np.ndarray,
                                 silent_from: np.ndarray, resumed_at: np.ndarray, window: float,
                                 min_share: float) -> np.ndarray:
    """Per silence (the job's traffic stopped by `silent_from` and resumed at `resumed_at`):
    whether at least `min_share` of the connections of its transfers within `window` from the
    resume also carried its transfers within `window` before the silence. `src`, `dst`: integer
    codes of the transfers' ends (>= 0), `port`: source port (< 0 where the record has none),
    `start`: their starts, sorted (the unit of the times and `window`). A silence with no port
    on either side is not resumed on the same connections."""
    return kept_connections_share(src, dst, port, start, silent_from, resumed_at, window) >= min_share


def kept_connections_share(src: np.ndarray, dst: np.ndarray, port: np.ndarray, start: np.ndarray,
                           silent_from: np.ndarray, resumed_at: np.ndarray, window: float) -> np.ndarray:
    """Per silence, as `resumed_on_same_connections`: the share of the connections of the
    transfers within `window` after it that also carried transfers within `window` before it
    (nan where either side has no port: the records tell nothing)."""
    known = port >= 0
    connection = combined_key(src, dst, port)
    kept = np.full(len(resumed_at), np.nan)
    for i, (stop, resume) in enumerate(zip(np.asarray(silent_from).tolist(), np.asarray(resumed_at).tolist())):
        lo, mid = np.searchsorted(start, [stop - window, stop], side="left")
        on, hi = np.searchsorted(start, [resume, resume + window], side="left")
        before = np.unique(connection[lo:mid][known[lo:mid]])
        after = np.unique(connection[on:hi][known[on:hi]])
        if len(before) and len(after):
            kept[i] = np.isin(after, before, assume_unique=True).mean()
    return kept


def coalesced_channels(flows: pa.Table, nics: pa.Array, start_within_s: float, size_spread: float,
                       min_even_share: float, chunk_rows: int = 1 << 20) -> pa.Table:
    """`flows` with each transfer that a pair of `nics` split over several queue pairs (NCCL
    channels, several queue pairs per channel) read as one record, the transfer's: the per-job
    stages then read one record per transfer whatever the exporter's queue pairs, at a fraction of
    the rows. `nics`: a job's NICs, each serving one GPU (a NIC serving two GPUs carries two GPUs'
    transfers at once: two transfers, not one's queue pairs); records to or from any other address
    (storage, monitoring, another job) are kept as they are.

    A NIC pair's records whose starts follow one another within `start_within_s` form a run (NCCL
    posts a transfer's channels together). A run on several source ports, each with as many
    records, all of about one size (the largest at most `size_spread` above the smallest), splits
    its transfers evenly: the k-th record of each port is the k-th transfer's. (Where a transfer is
    shorter than the spread of its queue pairs' starts, their records neither overlap nor keep one
    order: each queue pair's own sequence still tells the transfers apart.) Other runs are several
    transfers (sends of several sizes), or short of a lost record. The records are read so only if
    every NIC pair splits at least `min_even_share` of its runs (both ways, on a way with several
    queue pairs) evenly, a record with no queue pair to tell counting as a run that does not (a
    packet sampled at an instant: `sampling_rate` above 1 and no span; a record without a source
    port). Otherwise `flows` is returned as it is: the stages weigh a job's pairs against each
    other, and an all-to-all's queue pairs carry sends of their own sizes.

    A transfer's record is its first to start, lasting as long as its longest, with its bytes
    summed and its lowest source port (a pause keeps a job's connections, a restart makes new ones:
    the lowest of one set is the same port). Rows keep their order; the pairs are read `chunk_rows`
    records at a time, whole NIC pairs each, to bound the memory it takes."""
    if flows.num_rows < 2 or "src_port" not in flows.column_names or not len(nics):
        return flows
    # both ends numbered as `nics` are, so that both ways of a NIC pair make one link
    src, dst = (lookup(flows, name, nics) for name in ("src_addr", "dst_addr"))
    between = np.flatnonzero((src >= 0) & (dst >= 0))
    src, dst = src[between], dst[between]
    pair = combined_key(np.minimum(src, dst), np.maximum(src, dst)) * 2 + (src > dst)  # by link, then way
    del src, dst
    port = pc.fill_null(flows["src_port"], -1).to_numpy().astype(np.int32)
    start, end = flows["time_flow_start_ns"].to_numpy(), flows["time_flow_end_ns"].to_numpy()
    eligible = port[between] >= 0
    if "sampling_rate" in flows.column_names:  # a packet sampled at an instant: no transfer's record
        instant = (pc.fill_null(flows["sampling_rate"], 1).to_numpy() > 1) & (end <= start)
        eligible &= ~instant[between]
    if eligible.sum() < 2 or not _queue_pairs_side_by_side(pair, port, eligible, start, end, between):
        return flows
    # the rows between the NICs by pair, then start (positions among them, and in `flows`)
    order = np.argsort(start[between], kind="stable")
    way = unique_inverse(pair)[1]  # pairs ranked: a few thousand values, sorted in one radix pass
    order = order[stable_order(way[order], scattered=True)]
    pair, way, eligible, rows = pair[order], way[order], eligible[order], between[order]
    # whole links at a time, about chunk_rows records each: what a link's runs need stays bounded
    link = pair // 2
    link_starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
    del link
    cuts = np.unique(link_starts[np.minimum(np.searchsorted(link_starts, np.arange(0, len(rows), chunk_rows)),
                                            len(link_starts) - 1)])
    nbytes = flows["bytes"].to_numpy()
    merged = []
    for lo, hi in zip(cuts, np.r_[cuts[1:], len(rows)]):
        part = _merged_transfers(rows[lo:hi], pair[lo:hi], way[lo:hi], eligible[lo:hi], start, end, nbytes, port,
                                 start_within_s * NS_PER_S, size_spread, min_even_share)
        if part is None:
            return flows
        merged.append(part)
    dropped = np.concatenate([part.dropped for part in merged])
    if not len(dropped):
        return flows
    keep = np.ones(flows.num_rows, bool)
    keep[dropped] = False
    heads = (np.cumsum(keep) - 1)[np.concatenate([part.head for part in merged])]  # their rows once dropped ones go
    table = flows.filter(pa.array(keep))
    for name, values, transfers in (("time_flow_end_ns", end, [part.end for part in merged]),
                                    ("bytes", nbytes, [part.nbytes for part in merged]),
                                    ("src_port", port, [part.port for part in merged])):
        values = values[keep]
        values[heads] = np.concatenate(transfers)
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        column = pa.array(values, field.type, mask=values < 0) if name == "src_port" else pa.array(values, field.type)
        table = table.set_column(index, field, column)
    return table


PRECHECK_STRIDE = 16  # `_queue_pairs_side_by_side` looks at every 16th record first


def _queue_pairs_side_by_side(pair: np.ndarray, port: np.ndarray, eligible: np.ndarray, start: np.ndarray,
                              end: np.ndarray, between: np.ndarray) -> bool:
    """Whether some NIC pair (`pair`, of the records `between` the job's NICs) carries records
    from several source ports at once: most jobs run one queue pair per NIC pair, or move to new
    ones when they restart, and have nothing to merge. `port`, `start`, `end`: the whole table's;
    `eligible`: of `between`, the records whose queue pair tells. What every PRECHECK_STRIDE-th
    record shows, all of them do (a sample's spans lie inside the whole's), so a job whose records
    merge is told from the sample; so is a pair on several source ports."""
    several_ports = False
    for part in (slice(None, None, PRECHECK_STRIDE), slice(None)):
        rows, told = between[part], eligible[part]
        several_ports = several_ports or not _one_port_each(pair[part], port[rows])
        if not several_ports:
            continue
        considered = rows[told]
        if len(considered) >= 2 and not _one_queue_pair_at_a_time(pair[part][told], port[considered],
                                                                  start[considered], end[considered]):
            return True
    return False


def _port_key(pair: np.ndarray, port: np.ndarray) -> np.ndarray:
    return (pair << PORT_BITS) + port + 1


def _one_port_each(pair: np.ndarray, port: np.ndarray) -> bool:
    """Whether each pair's records all come from one source port: where the pairs' keys span few
    values, against a table of one record's port per pair (~5x faster); else counted by hashing."""
    if len(pair) and int(pair.max()) < MAX_DENSE_SPAN_PER_VALUE * len(pair):
        port_of_pair = np.empty(int(pair.max()) + 1, port.dtype)
        port_of_pair[pair] = port  # some record's: a pair's record on another port differs from it
        return bool(np.array_equal(port_of_pair[pair], port))

    def distinct(values: np.ndarray) -> int:
        return pc.count_distinct(pa.array(values)).as_py()

    return distinct(_port_key(pair, port)) == distinct(pair)


def _one_queue_pair_at_a_time(pair: np.ndarray, port: np.ndarray, start: np.ndarray, end: np.ndarray) -> bool:
    """Whether no pair's records from two source ports overlap in time (a restarted job moves to new
    queue pairs): from each (pair, port)'s first start and last end, by hashing."""
    spans = pa.table({"key": _port_key(pair, port), "start": start, "end": end}).group_by(
        "key", use_threads=False).aggregate([("start", "min"), ("end", "max")])
    key, first, last = (spans[name].to_numpy() for name in ("key", "start_min", "end_max"))
    order = np.lexsort((first, key >> PORT_BITS))
    same_pair = (key[order] >> PORT_BITS)[1:] == (key[order] >> PORT_BITS)[:-1]
    # the latest end among the pair's queue pairs so far: one running maximum, each pair's times
    # lifted above every earlier pair's
    lift = np.cumsum(np.r_[0, ~same_pair]) * (int(last.max()) - int(first.min()) + 1)
    first, last = first[order] - first.min() + lift, last[order] - first.min() + lift
    return not np.any(same_pair & (first[1:] < np.maximum.accumulate(last)[:-1]))


@dataclass(frozen=True)
class _Merged:
    dropped: np.ndarray  # rows read into another row's transfer
    head: np.ndarray  # the first row of each transfer of several records ...
    end: np.ndarray  # ... and its transfer's end, bytes and lowest source port
    nbytes: np.ndarray
    port: np.ndarray


def _merged_transfers(rows: np.ndarray, pair: np.ndarray, way: np.ndarray, eligible: np.ndarray, start: np.ndarray,
                      end: np.ndarray, nbytes: np.ndarray, port: np.ndarray, start_within_ns: float,
                      size_spread: float, min_even_share: float) -> _Merged | None:
    """`coalesced_channels` over `rows` of the flows (whole links, in (pair, start) order; `pair`,
    its rank `way` and `eligible` are theirs, the other arrays the whole table's); None where a
    link does not split its transfers evenly."""
    start, port = start[rows], port[rows]
    # a run: a pair's eligible records whose starts follow within start_within_ns; an ineligible
    # record is a run of its own
    follows = (pair[1:] == pair[:-1]) & (start[1:] - start[:-1] <= start_within_ns)
    follows &= eligible[1:] & eligible[:-1]
    run_starts = np.flatnonzero(np.r_[True, ~follows])
    run = np.cumsum(np.r_[0, ~follows])
    del follows
    sizes = nbytes[rows]
    even = np.maximum.reduceat(sizes, run_starts) <= np.minimum.reduceat(sizes, run_starts) * (1 + size_spread)
    # each run's queue pairs (run, port) and each record's place among its queue pair's records
    # (in start order: a stable sort keeps it)
    queue_pair = combined_key(run, port)
    by_queue_pair = stable_order(queue_pair, scattered=True)
    queue_pair_starts = np.flatnonzero(np.r_[True, np.diff(queue_pair[by_queue_pair]) != 0])
    del queue_pair
    records = np.diff(np.r_[queue_pair_starts, len(rows)])
    place = np.empty(len(rows), np.int64)
    place[by_queue_pair] = np.arange(len(rows)) - np.repeat(queue_pair_starts, records)
    first_of_run = np.searchsorted(run[by_queue_pair[queue_pair_starts]], np.arange(len(run_starts)))
    del by_queue_pair
    split = even & (np.diff(np.r_[first_of_run, len(records)]) >= 2)
    split &= np.minimum.reduceat(records, first_of_run) == np.maximum.reduceat(records, first_of_run)
    # a NIC pair splits its transfers evenly when nearly all of its runs, both ways, on a way with
    # several queue pairs split so: not one whose queue pairs carry sends of their own sizes (an
    # all-to-all's), nor one whose records go missing (a run short of a queue pair's record), nor
    # one with records whose queue pair cannot be told
    way_ports = pc.unique(pa.array(_port_key(way, port))).to_numpy()
    several_ports = np.bincount(way_ports >> PORT_BITS, minlength=way.max() + 1) >= 2
    several = several_ports[way[run_starts]] | ~eligible[run_starts]
    link_of_run = unique_inverse(pair[run_starts] // 2)[1]
    several_runs = np.bincount(link_of_run, several)
    even_share = np.bincount(link_of_run, split & several) / np.maximum(several_runs, 1)
    if np.any((even_share < min_even_share) & (several_runs > 0)):
        return None
    # a transfer of several records: (run, place) in a split run
    in_split = np.flatnonzero(split[run])
    if not len(in_split):
        nothing = np.zeros(0, np.int64)
        return _Merged(nothing, nothing, end[:0], nbytes[:0], port[:0])
    if place[in_split].any():
        transfer = unique_inverse(combined_key(run[in_split], place[in_split]))[1]
        by_transfer = stable_order(transfer, scattered=True)  # in start order within each transfer
        transfer_starts = np.flatnonzero(np.r_[True, np.diff(transfer[by_transfer]) != 0])
        by_transfer = in_split[by_transfer]
    else:  # one record per queue pair in every split run (the usual case): each run is a transfer
        by_transfer = in_split
        transfer_starts = np.flatnonzero(np.r_[True, np.diff(run[in_split]) != 0])
    members = rows[by_transfer]
    first = np.zeros(len(members), bool)
    first[transfer_starts] = True
    return _Merged(
        dropped=members[~first],
        head=members[first],
        # the transfer lasts as long as its slowest queue pair, from its first start: the spread of
        # its queue pairs' starts is no time it took (a slow link's throughput shows through it)
        end=start[by_transfer[transfer_starts]] + np.maximum.reduceat(end[members] - start[by_transfer],
                                                                      transfer_starts),
        nbytes=np.add.reduceat(nbytes[members], transfer_starts),
        port=np.minimum.reduceat(port[by_transfer], transfer_starts),
    )
