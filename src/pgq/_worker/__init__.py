"""The worker's parts. ``worker`` wires them; each other module owns one concern:
``producer`` (claims and slots), ``executor`` (one attempt), ``outcome``, ``completer``
(writing outcomes), ``liveness`` (heartbeats, fencing, re-registration, the probe's
verdict), ``control`` (notifications, cancel requests, the end of a burst), ``leader``
(the lease and the leader's services), ``health_server`` (``/healthz``)."""
