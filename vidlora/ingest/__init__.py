"""Bulk ingest: a content-addressed media store, hostile-archive extraction, source expansion.

Public names live in the submodules (``store``, ``archive``, ``sources``); import them from
there so that importing this package stays cheap.
"""

from __future__ import annotations
