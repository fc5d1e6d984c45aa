"""The gradient all-reduce of a train step, overlapped with backward (torch DDP's reducer).

The trainer passes :meth:`GradientReducer.weight_done` to the engine's ``gradient(on_leaf=...)``, which
calls it once per trainable weight as soon as that weight's gradient is final (a layer chain's node
delivers each layer's weight gradients as soon as that layer's backward made them).
:meth:`GradientReducer.layer_done` is the same hook per layer (it reads ``layer.grads``); without
either, :meth:`GradientReducer.finish` issues every bucket after backward. The reducer counts the
gradients of each bucket
(:class:`~dnnbind.distribution.planning.BucketSchedule`) and, as soon as a bucket is complete and
every bucket before it was issued:

* on CUDA it records an event on the compute stream, makes the communication stream wait on it
  and issues the bucket's averaging all-reduce there, one NCCL group of in-place calls, while the
  compute stream goes on with the backward of the earlier layers;
* with host arrays (the tests' loopback communicator) it calls ``all_reduce`` at once.

:meth:`GradientReducer.finish` issues what is left and makes the compute stream wait on the
communication stream's last event, so the loss-scale check and the optimizer update read the
averaged gradients. This fork and join through events is what CUDA stream capture needs: the
communication stream joins the capture through its wait on an event of the capturing stream,
and is joined back before the capture ends (:meth:`GradientReducer.close` joins on every path,
also when backward raised), so the whole exchange is part of the step's graph.

Every collective a step makes goes through one communication stream per device
(:class:`CollectiveStream`, owned by the distribution's ``Replica``): ``SyncBatchNormalization``'s
all-reduces too, forked and joined at once. NCCL does not promise that two collectives of one
communicator on two streams make progress together, so collectives are kept in one stream, in the
order every rank issues them.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .communicator import Communicator
from .planning import BucketSchedule

__all__ = ["CollectiveStream", "GradientReducer"]


class CollectiveStream:
    """One device's communication stream and the two events that fork work onto it and join it
    back. Made outside any capture (on the first, eager step) and reused by every later step: a
    recorded event may be recorded again, a wait takes the state it had when the wait was queued."""

    def __init__(self, device: int) -> None:
        from .. import cuda  # deferred: cuda.bindings loads only on a CUDA machine (module docstring of distribution)

        self.device = int(device)
        self.stream = cuda.Stream(self.device)
        self._fork = cuda.Event(timing=False, device=self.device)
        self._join = cuda.Event(timing=False, device=self.device)

    def fork(self, compute: Any) -> None:
        """Work queued on :attr:`stream` from now on waits for everything queued on ``compute``."""
        self._fork.record(compute)
        self.stream.wait_event(self._fork)

    def join(self, compute: Any) -> None:
        """Work queued on ``compute`` from now on waits for everything queued on :attr:`stream`."""
        self._join.record(self.stream)
        compute.wait_event(self._join)

    def run(self, compute: Any, issue: Callable[[Any], None]) -> None:
        """``issue(stream)`` on the communication stream, between a fork from ``compute`` and a join
        back: ``compute`` sees the result, ordered after the collectives issued before."""
        self.fork(compute)
        try:
            issue(self.stream)
        finally:
            self.join(compute)


class GradientReducer:
    """Averages one step's gradients over the ranks, bucket by bucket, as backward produces them.

    Parameters
    ----------
    comm:
        The communicator.
    slots:
        ``(layer, weight)`` of every trainable weight, in parameter (model) order: the order of the
        trainer's gradient list.
    plan:
        The buckets (:func:`~dnnbind.distribution.planning.plan_buckets` over ``slots``).
    collective:
        The device's :class:`CollectiveStream`, or None for host arrays (loopback communicators).
    compute:
        The compute stream of the step (None with host arrays).
    """

    op = "avg"

    def __init__(self, comm: Communicator, slots: Sequence[tuple[Any, Any]], plan: Sequence[Sequence[int]],
                 collective: "CollectiveStream | None" = None, compute: Any = None) -> None:
        self.comm = comm
        self._slots = list(slots)
        self._by_layer: dict[int, list[tuple[int, str]]] = {}
        self._by_weight: dict[int, int] = {}
        for index, (layer, weight) in enumerate(self._slots):
            self._by_layer.setdefault(id(layer), []).append((index, weight.name))
            self._by_weight[id(weight)] = index
        self._schedule = BucketSchedule(plan)
        self._grads: list[Any] = [None] * len(self._slots)
        self._collective = collective
        self._compute = compute
        self._forked = False

    @property
    def issued(self) -> int:
        """Buckets issued so far (a prefix of the plan)."""
        return self._schedule.issued

    def layer_done(self, layer: Any) -> None:
        """Backward's hook: ``layer`` wrote its weight gradients (``layer.grads``, final values: a
        shared layer reports once, after its last application). Issues the buckets it completed."""
        entries = self._by_layer.get(id(layer))
        if entries is None:
            return
        grads = layer.grads
        for index, name in entries:
            g = grads.get(name)
            if g is None or self._grads[index] is not None:
                continue
            self._grads[index] = g
            for bucket in self._schedule.deliver(index):
                self._issue(bucket)

    def weight_done(self, weight: Any, grad: Any) -> None:
        """The backward's hook (the engine's ``on_leaf``): ``weight``'s gradient is final (every read of it
        delivered, a shared weight's summed). Issues the buckets it completed."""
        index = self._by_weight.get(id(weight))
        if index is None or self._grads[index] is not None:
            return
        self._grads[index] = grad
        for bucket in self._schedule.deliver(index):
            self._issue(bucket)

    def finish(self, grads: Sequence[Any]) -> None:
        """After backward: ``grads`` is the trainer's gradient list (parameter order, the zeros it
        made for weights no loss reached included). Issues every bucket left, then the compute
        stream waits for all of them."""
        if len(grads) != len(self._slots):
            raise RuntimeError(f"GradientReducer: {len(grads)} gradients for {len(self._slots)} trainable weights")
        for index, g in enumerate(grads):
            mine = self._grads[index]
            if mine is None:
                self._grads[index] = g
            elif mine is not g:
                layer, weight = self._slots[index]
                raise RuntimeError(
                    f"GradientReducer: the gradient of '{layer.name}/{weight.name}' was replaced after the layer "
                    "reported it to the backward hook, so its all-reduce went to the old array; a layer must "
                    "write its final gradients before the hook runs")
        for bucket in self._schedule.flush():
            self._issue(bucket)
        self._join()

    def close(self) -> None:
        """Join the communication stream back (if a bucket went there and no join followed: a
        backward that raised) and drop the gradients. Idempotent."""
        self._join()
        self._grads = []

    def _issue(self, bucket: int) -> None:
        arrays = [self._grads[i] for i in self._schedule.plan[bucket]]
        if self._collective is None:
            self.comm.all_reduce(arrays, self.op)
            return
        # the bucket's gradients were written on the compute stream: the communication stream waits
        # for them, not for the backward queued after
        self._collective.fork(self._compute)
        self._forked = True
        self.comm.all_reduce(arrays, self.op, stream=self._collective.stream)

    def _join(self) -> None:
        if self._forked:
            self._forked = False
            self._collective.join(self._compute)
