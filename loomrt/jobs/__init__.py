"""The work queue on PostgreSQL, on a maintained job engine: procrastinate (issue 45).

- :mod:`loomrt.jobs.schema`: the engine's schema, and a trigger that makes a job for each
  piece of queued work in the same transaction as the record's event that queues it
  (``run_queued``, ``fold_queued``, ``distillation_queued``), registered as a part of
  ``loomrt db migrate``;
- :mod:`loomrt.jobs.engine`: the jobs (play a run, distil one, consolidate a scope) and
  ``loomrt worker`` on PostgreSQL: procrastinate's worker plus loomrt's sweep.

The engine holds the queue, the workers' registrations and heartbeats, the wake-ups
(LISTEN/NOTIFY), concurrency and the graceful stop. loomrt keeps the last word on who may
append to a run: a job claims its run (:mod:`loomrt.record.owners`) and appends under its
epoch, so a job the engine hands out twice never writes twice. On SQLite the record itself
stays the queue (:mod:`loomrt.worker`): procrastinate serves PostgreSQL only.
"""
