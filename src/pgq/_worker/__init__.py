"""The worker, one module per idea: ``worker`` (the Worker: its run, its assembly, its
snapshot), ``producer`` (one queue's state machine: claims, slots, hand-backs), ``attempt``
(one attempt and its Outcome), ``outcomes`` (writing outcomes: in batches, or in the task's
own transaction), ``liveness`` (heartbeats, fencing, re-registration, the probe's verdict),
``recovery`` (strays, a stable name's previous run, commits whose reply was lost, rescue
reports), ``control`` (notifications, cancel requests, the end of a burst), ``health``
(``/healthz``) and ``leader`` (the lease and the leader's services)."""
