"""The composition root: the ``vidlora`` command, the demo and the deployment doctor.

Everything below it is a library that knows nothing of how it is started: ``vidlora``
(the domain: config, database, media, scenarios, status), ``engine_patch`` (vLLM made
correct for LoRA on GDN hybrids), ``workers`` (the engine host), ``tasks`` (Celery: the
pipeline's messages and its worker processes) and ``web`` (the review UI, which hands its
commands up here). Only this package imports all of them; `.importlinter` holds the layers.
"""
