"""The transport between the agent and its workers.

:mod:`.protocol` defines the commands and replies and their wire encoding,
:mod:`.channel` carries frames over a socket (polling for a bounded time where
:mod:`.spin` says it pays), :mod:`.memory` maps the shared region, :mod:`.buffers`
lays the batched arrays out in it, and :mod:`.spaces` maps Gymnasium spaces onto
those arrays (what can be shared, reading and writing rows, checking a batch). It
knows nothing of envs or of who sends what: both sides import it, it imports neither.
"""
