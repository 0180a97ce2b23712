"""Parallelism, applied in one place: process groups (`distributed`), the validated layout of a role
(`dims.ParallelDims`), FSDP1/FSDP2 wrapping (`fsdp`), operations on sharded models (`sharded`: gradient
clipping, full parameters, offload), Ulysses sequence parallelism (`ulysses`) and sharded checkpoints
(`checkpoint`)."""
