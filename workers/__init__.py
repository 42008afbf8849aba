"""The GPU side: one vLLM engine per process serving every adapter (`engine_host`), the GPU
workers' registry and heartbeats, and the tiny random-weight Qwen3.5 model the embedded
default runs on. Celery is not imported here: the worker process that hosts an engine is
`tasks.gpu_worker`."""
