"""Several devices: the controller and its worker processes.

`pool.WorkerPool` starts one worker per device (`python -m shapescript.parallel.worker`, a fresh
interpreter that never imports the user's main script), joins them in a torch.distributed process
group (Gloo for cpu[...], NCCL for cuda[...]) and calls named handlers on all of them at once
(`handlers.HANDLERS`). `worker.WorkerState` is what a handler gets: its rank, device, the objects it
keeps between calls, and the status helpers that let the controller say where a stuck worker was.
"""

from shapescript.parallel.interrupts import StepInterrupt
from shapescript.parallel.loading import RemoteBatch
from shapescript.parallel.pool import WorkerPool, collective_timeout
from shapescript.parallel.remote import RemoteFunction, RemoteModel, RemoteOptimizer, RemoteSubModel

__all__ = ["RemoteBatch", "RemoteFunction", "RemoteModel", "RemoteOptimizer", "RemoteSubModel",
           "StepInterrupt", "WorkerPool", "collective_timeout"]
