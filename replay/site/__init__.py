"""The audit site: a static website of one run, generated from its run directory and certificates only.

`python -m app audit site --run RUN --out DIR` (replay.site.build): an overview (identity, verdict, coverage, the
commands that reproduce the run and its audits), plots, a table of every step and a view per step (its windows
and the documents that fed them, stage digests, hashes, certificates). Pages are plain HTML with a little vanilla
JavaScript; their data are JSON, each file wrapped in one call `SITE.receive(name, data)` so that a page opened
from file:// can load it (browsers refuse fetch() of local files), and rendered with textContent only.
"""
