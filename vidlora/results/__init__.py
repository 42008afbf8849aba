"""Results as data: a structured answer's fields (``fields``), conditions people type on them
(``conditions``), the query and facets (``query``), the row shape (``rows``) and the exports
(``export``, ``parquet``). The pages, the API and ``vidlora results`` all use these."""
