"""What tests share: the real-process harness (`workers`), where the services are (`env`) and
the builders of inputs (videos, the tiny model, adapters, batch rows). Tests import from here,
never from each other or from a conftest."""
