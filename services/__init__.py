"""Services: the operations the API, the CLI and the SDK call - groups, review queues, judge
examples, the playground, a run's spend - over the core and the adapters."""
