"""Pure functions of data parallelism: which samples a rank reads, how gradients are bucketed, and
when a bucket may be all-reduced during backward.

Nothing here touches a device or a process: the plans are computed identically on every rank from
the same inputs, which is what keeps the ranks in step (NCCL needs every rank to issue the same
collectives in the same order).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["shard_order", "shard_length", "plan_buckets", "BucketSchedule", "BUCKET_BYTES", "FIRST_BUCKET_BYTES"]

#: torch DDP's ``bucket_cap_mb=25`` and its smaller first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``)
BUCKET_BYTES = 25 * 1024 * 1024
FIRST_BUCKET_BYTES = 1024 * 1024


def shard_length(num_items: int, world_size: int) -> int:
    """How many items each rank reads: ``ceil(num_items / world_size)`` (the remainder is padded)."""
    return -(-int(num_items) // int(world_size))


def shard_order(order: "np.ndarray | int", rank: int, world_size: int) -> np.ndarray:
    """This rank's items, as torch's ``DistributedSampler(drop_last=False)`` picks them.

    ``order`` is the pass's order of item indices (a permutation drawn from the seed every rank
    shares, or ``num_items`` for ``arange``). The remainder rule: the order is **padded by
    wrapping around** to a multiple of ``world_size`` (its first items repeated), then rank ``r``
    takes positions ``r, r + world_size, r + 2 * world_size, ...``. So the shards are disjoint
    apart from the at most ``world_size - 1`` repeated items, together cover every item, and all
    have :func:`shard_length` items (every rank runs the same number of steps, which the
    collectives need).

    With ``fit(batch_size=B)`` (the global batch) each rank batches its shard by ``B // world_size``;
    global batch ``k`` is then exactly ``order[k*B:(k+1)*B]`` (padded), the batch a one-process
    ``fit`` would take.
    """
    order = np.arange(int(order)) if np.ndim(order) == 0 else np.asarray(order)
    if not (0 <= rank < world_size):
        raise ValueError(f"shard_order: rank must be in [0, {world_size}), got {rank}")
    n = len(order)
    if n == 0:
        return order[:0]
    total = shard_length(n, world_size) * world_size
    return np.resize(order, total)[rank::world_size]  # resize repeats the order (more than once if need be)


def plan_buckets(nbytes: Sequence[int], dtypes: Sequence[str], *, bucket_bytes: int = BUCKET_BYTES,
                 first_bucket_bytes: int = FIRST_BUCKET_BYTES) -> list[list[int]]:
    """Group gradients into all-reduce buckets, as torch DDP: **reverse parameter order** (the order
    backward produces them), a bucket closed once it reaches ``bucket_bytes`` (the first one at
    ``first_bucket_bytes``, so communication starts early), one dtype per bucket.

    Parameters
    ----------
    nbytes:
        Size in bytes of each gradient, in parameter (model) order.
    dtypes:
        Dtype name of each gradient (a bucket never mixes dtypes: NCCL reduces one type per call
        and DDP buckets likewise).

    Returns
    -------
    list of lists of parameter indices: the buckets in the order they are reduced, each listing
    its gradients in reverse parameter order. Every index appears exactly once; a gradient larger
    than the cap gets a bucket of its own.
    """
    if len(nbytes) != len(dtypes):
        raise ValueError(f"plan_buckets: {len(nbytes)} sizes but {len(dtypes)} dtypes")
    if bucket_bytes < 1 or first_bucket_bytes < 1:
        raise ValueError(f"plan_buckets: bucket sizes must be >= 1 byte, got {bucket_bytes}, {first_bucket_bytes}")
    buckets: list[list[int]] = []
    open_by_dtype: dict[str, tuple[list[int], int]] = {}
    for index in reversed(range(len(nbytes))):
        dtype = str(dtypes[index])
        members, size = open_by_dtype.get(dtype, (None, 0))
        if members is None:
            members = []
            buckets.append(members)
        members.append(index)
        size += int(nbytes[index])
        cap = first_bucket_bytes if len(buckets) == 1 and buckets[0] is members else bucket_bytes
        if size >= cap:
            open_by_dtype.pop(dtype, None)
        else:
            open_by_dtype[dtype] = (members, size)
    return buckets


class BucketSchedule:
    """Which buckets of a plan may be all-reduced as backward delivers gradients (torch DDP's rule).

    Gradients are *delivered* one by one, in whatever order backward produces them. A bucket is
    complete once every one of its gradients was delivered; it is **issued** only when it is
    complete and every bucket before it in the plan was issued, so the collectives leave every
    rank in plan order even if backward finished buckets out of order (as a functional model's
    branches may). A fresh schedule is made for each step; it never looks at the arrays.

    Parameters
    ----------
    plan:
        The buckets from :func:`plan_buckets` (lists of parameter indices, in issue order).
    """

    __slots__ = ("plan", "_bucket_of", "_remaining", "_delivered", "_next")

    def __init__(self, plan: Sequence[Sequence[int]]) -> None:
        self.plan = [list(b) for b in plan]
        self._bucket_of: dict[int, int] = {i: k for k, b in enumerate(self.plan) for i in b}
        if len(self._bucket_of) != sum(len(b) for b in self.plan):
            raise ValueError("BucketSchedule: a parameter index appears in more than one bucket")
        self._remaining = [len(b) for b in self.plan]
        self._delivered: set[int] = set()
        self._next = 0

    @property
    def issued(self) -> int:
        """How many buckets (a prefix of the plan) were issued so far."""
        return self._next

    @property
    def done(self) -> bool:
        return self._next == len(self.plan)

    def deliver(self, index: int) -> list[int]:
        """Parameter ``index``'s gradient is ready; returns the buckets to issue now, in order (often
        none). Delivering an index twice, or one outside the plan, changes nothing."""
        bucket = self._bucket_of.get(index)
        if bucket is None or index in self._delivered:
            return []
        self._delivered.add(index)
        self._remaining[bucket] -= 1
        return self._ready()

    def flush(self) -> list[int]:
        """Backward is over: every bucket not issued yet, in order (their missing gradients are then
        taken as they are, e.g. the zeros the trainer makes for weights no loss reached)."""
        for k in range(self._next, len(self.plan)):
            self._remaining[k] = 0
        return self._ready()

    def _ready(self) -> list[int]:
        start = self._next
        while self._next < len(self.plan) and self._remaining[self._next] == 0:
            self._next += 1
        return list(range(start, self._next))
