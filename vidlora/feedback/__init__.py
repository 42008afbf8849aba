"""The feedback loop: reviewed answers measure each adapter version, become its next training
set, and a new version proves itself on the gold set before it serves (docs/feedback-loop.md).

- ``agreement``: the scoring rules and rates, pure; ``measure``: per version, from the database
- ``gold``: the held-out set; ``training_set``: the export trainers read
- ``releases``: a scenario's adapter versions (candidate, promote, rollback);
  ``compare``: a candidate beside the stored answers on the gold set
"""
