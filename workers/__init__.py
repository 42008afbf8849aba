"""The GPU side: one vLLM engine per process serving every adapter (`engine_host`), the loop
that keeps it full (`engine_stream`), and the GPU workers' registry and heartbeats. Celery is
not imported here: the worker process that hosts an engine is `tasks.gpu_worker`."""
