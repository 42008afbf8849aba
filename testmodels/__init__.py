"""Random-weight test models with the real Qwen3.5 architectures at toy sizes, built on the
spot (nothing is downloaded): ``tiny`` (the dense vision-language model and one LoRA adapter
per scenario) and ``tiny_moe`` (its MoE sibling and adapters on each kind of MoE module).
The engine, guard, fault and numerics tests, the benchmarks and ``engine_patch.verify`` run
on them; ``demo_model`` trains the shipped demo model from the same shapes. Nothing that
serves imports this package (``.importlinter``)."""
